//! Pipeline coordinator CLI (being built).

fn main() {
    eprintln!("transfer-rpc-pipeline: not built yet");
    std::process::exit(2);
}
