//! Slurm's compressed hostlist syntax: `node[01-03,07],gpu5` expands to
//! `node01 node02 node03 node07 gpu5`.
//!
//! Items are separated by commas outside brackets; an item may hold several
//! bracket groups (`rack[1-2]-n[1-2]` is the product, rack-major, as Slurm
//! prints it); a range keeps the zero padding of its lower bound (`[08-10]`
//! gives `08 09 10`, `[8-10]` gives `8 9 10`). The input comes from the
//! environment, so everything is bounded: the number of hosts expanded
//! ([`MAX_HOSTS`]) and the input length ([`MAX_INPUT`]).

use crate::error::{LaunchError, Result};

/// Most hosts one hostlist may expand to (a larger cluster is not a
/// rendezvous this crate is built for, and it bounds the memory a hostile
/// `node[0-99999999999]` could ask for).
pub const MAX_HOSTS: usize = 65_536;

/// Longest hostlist accepted, in bytes.
pub const MAX_INPUT: usize = 1 << 20;

/// Longest host name produced (DNS's limit).
const MAX_NAME: usize = 253;

fn err(input: &str, reason: impl Into<String>) -> LaunchError {
    // Error messages stay readable even for a huge input.
    let shown: String = input.chars().take(80).collect();
    LaunchError::Hostlist {
        input: shown,
        reason: reason.into(),
    }
}

/// Expands a Slurm hostlist into host names, in order.
pub fn expand(input: &str) -> Result<Vec<String>> {
    if input.len() > MAX_INPUT {
        return Err(err(input, format!("longer than {MAX_INPUT} bytes")));
    }
    let mut hosts = Vec::new();
    for item in split_top_level(input)? {
        let item = item.trim();
        // Slurm tolerates stray separators (`a,,b`); so does this.
        if item.is_empty() {
            continue;
        }
        expand_item(input, item, &mut hosts)?;
    }
    Ok(hosts)
}

/// Splits at commas that are not inside brackets.
fn split_top_level(input: &str) -> Result<Vec<&str>> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in input.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(err(input, "nested '['")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(err(input, "']' without '['")),
            ',' if depth == 0 => {
                items.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(err(input, "'[' without ']'"));
    }
    items.push(&input[start..]);
    Ok(items)
}

/// One piece of an item: literal text, or the numbers of a bracket group
/// (already formatted with their padding).
enum Piece<'a> {
    Text(&'a str),
    Choices(Vec<String>),
}

fn expand_item(input: &str, item: &str, hosts: &mut Vec<String>) -> Result<()> {
    let mut pieces = Vec::new();
    let mut rest = item;
    let mut combos: usize = 1;
    while let Some(open) = rest.find('[') {
        pieces.push(Piece::Text(&rest[..open]));
        let after = &rest[open + 1..];
        let close = after
            .find(']')
            .ok_or_else(|| err(input, "'[' without ']'"))?;
        let choices = expand_ranges(input, &after[..close], MAX_HOSTS - hosts.len())?;
        combos = combos
            .checked_mul(choices.len())
            .filter(|&c| c <= MAX_HOSTS - hosts.len())
            .ok_or_else(|| err(input, format!("expands to more than {MAX_HOSTS} hosts")))?;
        pieces.push(Piece::Choices(choices));
        rest = &after[close + 1..];
    }
    pieces.push(Piece::Text(rest));
    if combos > MAX_HOSTS - hosts.len() {
        return Err(err(
            input,
            format!("expands to more than {MAX_HOSTS} hosts"),
        ));
    }
    let mut names = vec![String::new()];
    for p in &pieces {
        names = match p {
            Piece::Text(t) => names.into_iter().map(|n| n + t).collect(),
            Piece::Choices(cs) => names
                .iter()
                .flat_map(|n| cs.iter().map(move |c| format!("{n}{c}")))
                .collect(),
        };
    }
    for n in names {
        if n.len() > MAX_NAME {
            return Err(err(
                input,
                format!("host name longer than {MAX_NAME} bytes"),
            ));
        }
        if n.chars().any(|c| c.is_whitespace()) {
            return Err(err(input, format!("host name {n:?} contains whitespace")));
        }
        hosts.push(n);
    }
    Ok(())
}

/// Expands `01-03,07` into `["01", "02", "03", "07"]`, at most `budget` values.
fn expand_ranges(input: &str, body: &str, budget: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for part in body.split(',') {
        let part = part.trim();
        let (lo_s, hi_s) = part.split_once('-').unwrap_or((part, part));
        let lo = parse_num(input, lo_s)?;
        let hi = parse_num(input, hi_s)?;
        if hi < lo {
            return Err(err(input, format!("range {part:?} runs backwards")));
        }
        let count = hi - lo + 1;
        if count > (budget - out.len().min(budget)) as u64 {
            return Err(err(
                input,
                format!("expands to more than {MAX_HOSTS} hosts"),
            ));
        }
        // Slurm pads every number to the width of the lower bound as written.
        let width = lo_s.len();
        for v in lo..=hi {
            out.push(format!("{v:0width$}"));
        }
    }
    Ok(out)
}

fn parse_num(input: &str, s: &str) -> Result<u64> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(input, format!("{s:?} is not a host number")));
    }
    s.parse()
        .map_err(|_| err(input, format!("{s:?} is not a host number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand(s).unwrap()
    }

    #[test]
    fn plain_names_and_lists() {
        assert_eq!(ex("gpu5"), ["gpu5"]);
        assert_eq!(ex("a,b , c"), ["a", "b", "c"]);
        assert_eq!(ex("a,,b,"), ["a", "b"]);
        assert!(ex("").is_empty());
    }

    #[test]
    fn ranges_keep_the_lower_bound_padding() {
        assert_eq!(
            ex("node[01-03,07],gpu5"),
            ["node01", "node02", "node03", "node07", "gpu5"]
        );
        assert_eq!(ex("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(ex("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(ex("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(ex("n[5]"), ["n5"]);
    }

    #[test]
    fn suffixes_and_several_groups_multiply() {
        assert_eq!(ex("n[1-2]-ib"), ["n1-ib", "n2-ib"]);
        assert_eq!(
            ex("r[1-2]n[1-2]"),
            ["r1n1", "r1n2", "r2n1", "r2n2"],
            "rack-major, like Slurm"
        );
        assert_eq!(
            ex("a[1-2],b[3],c"),
            ["a1", "a2", "b3", "c"],
            "commas inside and outside brackets"
        );
    }

    #[test]
    fn malformed_lists_are_errors_not_panics() {
        for bad in [
            "n[1-", "n[1-2", "n]1", "n[[1]]", "n[a-b]", "n[3-1]", "n[]", "n[-1]", "n[1-2-3]",
            "n[1,]",
        ] {
            assert!(expand(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn huge_expansions_are_refused() {
        let e = expand("n[0-99999999999]").unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        assert!(expand("a[1-300]b[1-300]").is_err(), "90 000 > MAX_HOSTS");
        assert_eq!(expand("n[1-65536]").unwrap().len(), MAX_HOSTS);
        assert!(expand("n[1-65536],x").is_err());
    }
}
