fn main() {
    eprintln!("transfer-bench: not implemented yet (issue 4)");
    std::process::exit(2);
}
