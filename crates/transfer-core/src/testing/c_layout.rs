//! Struct layouts as the C compiler sees them, for the backends' FFI
//! mirrors: a test lists `sizeof` / `offsetof` expressions next to the
//! Rust `size_of` / `offset_of!` of its mirror, and this compiles the C
//! side against the real headers and runs it. A mirror that drifted from
//! the header fails the test; hand-typed expected numbers could not catch
//! a struct that was wrong from the start.

use std::path::PathBuf;
use std::process::Command;

/// One probed quantity: the C expression and the Rust value.
#[derive(Debug, Clone)]
pub struct Probe {
    /// e.g. `offsetof(struct fi_info, nic)`.
    pub c_expr: String,
    /// What the Rust mirror says.
    pub rust: usize,
}

/// Compiles a program that prints every `c_expr` (after `#include`ing
/// `headers`) with the system C compiler (`$CC`, else `cc`) and returns
/// the values it printed, in order. `Err` when there is no compiler, a
/// header is missing, or the program fails.
pub fn c_values(headers: &[&str], probes: &[Probe]) -> Result<Vec<usize>, String> {
    let dir = std::env::temp_dir().join(format!(
        "transfer-c-layout-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "_")
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut src = String::from("#include <stddef.h>\n#include <stdio.h>\n");
    for h in headers {
        src.push_str(&format!("#include <{h}>\n"));
    }
    src.push_str("int main(void) {\n");
    for p in probes {
        src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({}));\n", p.c_expr));
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.join("probe.c");
    let exe: PathBuf = dir.join("probe");
    std::fs::write(&c, src).map_err(|e| format!("{}: {e}", c.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("{cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cc} failed on the layout probe: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&run.stdout);
    let values: Vec<usize> = text
        .lines()
        .map(|l| l.trim().parse::<usize>().map_err(|e| format!("{l}: {e}")))
        .collect::<Result<_, _>>()?;
    if values.len() != probes.len() {
        return Err(format!(
            "{} values for {} probes",
            values.len(),
            probes.len()
        ));
    }
    Ok(values)
}

/// Every probe whose Rust value differs from C's, as `expr: rust R, C c`.
pub fn mismatches(probes: &[Probe], c: &[usize]) -> Vec<String> {
    probes
        .iter()
        .zip(c)
        .filter(|(p, c)| p.rust != **c)
        .map(|(p, c)| format!("{}: rust {}, C {c}", p.c_expr, p.rust))
        .collect()
}

/// The whole check a layout test makes: compile the probes against
/// `headers`, skip (or fail, when `TRANSFER_REQUIRE` names `headers`) if
/// that cannot be done, and panic listing every mirror that differs.
#[allow(clippy::panic)]
pub fn assert_layouts(package: &str, headers: &[&str], probes: &[Probe]) {
    let c = match c_values(headers, probes) {
        Ok(c) => c,
        Err(e) => {
            crate::testing::skip_or_fail(
                "headers",
                format!("C headers (apt-get install {package}): {e}"),
            );
            return;
        }
    };
    let bad = mismatches(probes, &c);
    if !bad.is_empty() {
        panic!("mirrors differ from the headers: {bad:#?}");
    }
}

/// `Probe`s from a list: `size TYPE`, `offset TYPE.FIELD` or
/// `offset TYPE.FIELD = "c.path"` when the C member path differs from
/// the Rust field name (a flattened union, a padding field).
#[macro_export]
macro_rules! c_layout_probes {
    ($($kind:ident $ty:ident $(. $field:ident $(= $cpath:literal)?)?),* $(,)?) => {
        vec![$($crate::c_layout_probes!(@one $kind $ty $(. $field $(= $cpath)?)?)),*]
    };
    (@one size $ty:ident) => {
        $crate::testing::c_layout::Probe {
            c_expr: concat!("sizeof(struct ", stringify!($ty), ")").to_string(),
            rust: ::std::mem::size_of::<$ty>(),
        }
    };
    (@one offset $ty:ident . $field:ident) => {
        $crate::testing::c_layout::Probe {
            c_expr: concat!("offsetof(struct ", stringify!($ty), ", ", stringify!($field), ")")
                .to_string(),
            rust: ::std::mem::offset_of!($ty, $field),
        }
    };
    (@one offset $ty:ident . $field:ident = $cpath:literal) => {
        $crate::testing::c_layout::Probe {
            c_expr: concat!("offsetof(struct ", stringify!($ty), ", ", $cpath, ")").to_string(),
            rust: ::std::mem::offset_of!($ty, $field),
        }
    };
}

/// `Probe`s for whole structs: the `sizeof` of each and the `offsetof` of
/// every one of its fields, written `TYPE { field, field = "c.path", .. }`
/// (no `..`: every field is named). The list is checked complete at compile
/// time (a struct pattern without `..` must name every field), so a field
/// added to a mirror cannot go unprobed, and two members swapped in a
/// mirror (same size, so `sizeof` alone would agree) fail on their offsets.
#[macro_export]
macro_rules! c_layout_structs {
    ($($ty:ident { $($field:ident $(= $cpath:literal)?),* $(,)? }),* $(,)?) => {{
        $(
            // Never called: does not compile unless every field is listed.
            let _ = |$ty { $($field: _),* }: $ty| ();
        )*
        let mut probes = ::std::vec::Vec::new();
        $(
            probes.push($crate::c_layout_probes!(@one size $ty));
            $(probes.push($crate::c_layout_probes!(@one offset $ty . $field $(= $cpath)?));)*
        )*
        probes
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[allow(non_camel_case_types, dead_code)]
    struct tm {
        tm_sec: i32,
        tm_min: i32,
        tm_hour: i32,
        tm_mday: i32,
        tm_mon: i32,
        tm_year: i32,
        tm_wday: i32,
        tm_yday: i32,
        tm_isdst: i32,
        tm_gmtoff: i64,
        tm_zone: *const u8,
    }

    #[test]
    fn a_libc_struct_matches_and_a_wrong_one_is_caught() {
        let probes = crate::c_layout_probes![size tm, offset tm.tm_gmtoff, offset tm.tm_zone];
        let c = match c_values(&["time.h"], &probes) {
            Ok(c) => c,
            Err(e) => {
                crate::testing::skip_or_fail("headers", e);
                return;
            }
        };
        assert!(
            mismatches(&probes, &c).is_empty(),
            "{:?}",
            mismatches(&probes, &c)
        );
        let mut wrong = probes.clone();
        wrong[1].rust += 4;
        assert_eq!(mismatches(&wrong, &c).len(), 1);
    }

    /// `struct tm` with two members swapped: same size, so only the
    /// per-member offsets of `c_layout_structs!` see it.
    mod swapped {
        #[repr(C)]
        #[allow(non_camel_case_types, dead_code)]
        pub struct tm {
            pub tm_min: i32,
            pub tm_sec: i32,
            pub tm_hour: i32,
            pub tm_mday: i32,
            pub tm_mon: i32,
            pub tm_year: i32,
            pub tm_wday: i32,
            pub tm_yday: i32,
            pub tm_isdst: i32,
            pub tm_gmtoff: i64,
            pub tm_zone: *const u8,
        }
    }

    #[test]
    fn every_member_is_probed_so_a_swap_is_caught() {
        let good = crate::c_layout_structs![tm {
            tm_sec,
            tm_min,
            tm_hour,
            tm_mday,
            tm_mon,
            tm_year,
            tm_wday,
            tm_yday,
            tm_isdst,
            tm_gmtoff,
            tm_zone
        }];
        let bad = {
            use swapped::tm;
            crate::c_layout_structs![tm {
                tm_min,
                tm_sec,
                tm_hour,
                tm_mday,
                tm_mon,
                tm_year,
                tm_wday,
                tm_yday,
                tm_isdst,
                tm_gmtoff,
                tm_zone
            }]
        };
        assert_eq!(good.len(), 12);
        let c = match c_values(&["time.h"], &good) {
            Ok(c) => c,
            Err(e) => {
                crate::testing::skip_or_fail("headers", e);
                return;
            }
        };
        assert!(
            mismatches(&good, &c).is_empty(),
            "{:?}",
            mismatches(&good, &c)
        );
        let c_bad = c_values(&["time.h"], &bad).unwrap_or_default();
        let m = mismatches(&bad, &c_bad);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m.iter()
                .all(|l| l.contains("tm_min") || l.contains("tm_sec")),
            "{m:?}"
        );
    }
}
