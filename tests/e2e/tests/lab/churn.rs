//! The "churn and leaks" case, short: pod ADD/DEL cycles with random
//! concurrency and SIGKILLed plugins on a lab node leave nothing behind,
//! and GC frees exactly the attachments it is not told are valid.

use crate::common;

use std::time::Instant;

use anyhow::Result;
use mycni_lab::soak::{churn::churn, table};

fn run(cycles: usize, seed: u64) -> Result<()> {
    let t0 = Instant::now();
    let t = common::lab(1, 0)?;
    let r = churn(&t.0, 1, cycles, seed)?;
    eprintln!(
        "{}(lab and case in {:.1} s)",
        table(std::slice::from_ref(&r)),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(r.leaks, 0, "{}", r.notes);
    Ok(())
}

#[test]
fn churn_with_killed_plugins_leaks_nothing() -> Result<()> {
    let _turn = crate::turn(module_path!());
    run(150, 0x6c65616b)
}

/// The full case: `cargo test -p mycni-e2e --test lab -- --ignored churn::`.
#[test]
#[ignore = "1,000 cycles: the soak run"]
fn churn_1000_cycles() -> Result<()> {
    let _turn = crate::turn(module_path!());
    run(1000, 0x636875726e)
}
