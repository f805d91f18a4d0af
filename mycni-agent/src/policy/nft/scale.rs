//! The policy bench's scale (1,000 policies, a 10,000-prefix ipBlock):
//! where a pass's time goes (compile, sets, the nft scripts, both ways; an
//! ignored measurement: `cargo test -p mycni-agent --release --lib
//! policy::nft::scale -- --ignored --nocapture`, with
//! `MYCNI_SCALE_SCRIPTS=<dir>` to keep the scripts for replaying with
//! `nft -f`), and the rule that writes such a change whole.

use std::time::Instant;

use super::{diff_script, full_script, whole_is_cheaper};
use crate::cluster::fixture::bench_cluster;
use crate::cluster::{Cluster, Key};
use crate::policy::{compile_node, sets};

#[test]
#[ignore]
fn a_pass_at_the_policy_benchs_scale() {
    let empty = sets::desired(&compile_node(&Cluster::default(), "node2"), false);
    for (policies, prefixes) in [(10, 0), (1_000, 0), (1, 10_000), (1_000, 10_000)] {
        let t = Instant::now();
        let c = bench_cluster(policies, prefixes);
        let built = t.elapsed();
        let t = Instant::now();
        let compiled = compile_node(&c, "node2");
        let compile = t.elapsed();
        let t = Instant::now();
        let want = sets::desired(&compiled, true);
        let desired = t.elapsed();
        let t = Instant::now();
        let full = full_script(&want, 1);
        let full_t = t.elapsed();
        let t = Instant::now();
        let add = diff_script(&empty, &want, 2).unwrap_or_default();
        let add_t = t.elapsed();
        let t = Instant::now();
        let del = diff_script(&want, &empty, 3).unwrap_or_default();
        let del_t = t.elapsed();
        if let Some(dir) = std::env::var_os("MYCNI_SCALE_SCRIPTS") {
            let dir = std::path::Path::new(&dir);
            let name = format!("{policies}-{prefixes}");
            for (what, text) in [("full", &full), ("add", &add), ("del", &del)] {
                std::fs::write(dir.join(format!("{name}.{what}.nft")), text).expect("write script");
            }
        }
        eprintln!(
            "{policies:>5} policies, {prefixes:>6} prefixes: cluster {built:.1?}, compile {compile:.1?}, sets {desired:.1?} ({} elements), full script {full_t:.1?} ({} B), add {add_t:.1?} ({} B), delete {del_t:.1?} ({} B)",
            want.len(),
            full.len(),
            add.len(),
            del.len()
        );
    }
}

/// Deleting thousands of interval elements one by one takes minutes in the
/// kernel (see `nft::WHOLE_PER_ELEMENT`): such a change writes the table
/// whole; a small one stays a diff, whichever way.
#[test]
fn a_change_that_deletes_many_elements_writes_the_table_whole() {
    let desired = |policies, prefixes| {
        sets::desired(
            &compile_node(&bench_cluster(policies, prefixes), "node2"),
            true,
        )
    };
    let (small, big) = (desired(1_000, 0), desired(1_000, 10_000));
    assert!(big.len() > 10_000, "{}", big.len());
    assert!(
        whole_is_cheaper(&big, &small),
        "the ipBlock's 10,000 prefixes deleted one by one"
    );
    assert!(!whole_is_cheaper(&small, &big), "adding them");
    // One more prefix, or one fewer, beside 10,000: a diff.
    let (a, b) = (desired(1_000, 10_000), desired(1_000, 9_999));
    assert!(!whole_is_cheaper(&a, &b), "one prefix less");
    assert!(!whole_is_cheaper(&b, &a), "one prefix more");
    // A decoy policy less among 1,000: a diff.
    assert!(
        !whole_is_cheaper(&small, &desired(999, 0)),
        "one policy less"
    );
}

/// What the flows room pays per admitted connection at this scale: one
/// `cluster::allowed` over the whole cluster (it names the admitting rules
/// of every NFLOG allow record). A measurement: see the module's doc.
#[test]
#[ignore]
fn allowed_per_connection_at_the_policy_benchs_scale() {
    use crate::cluster::{Endpoint, Protocol, allowed};
    let end = |name: &str, ip: &str| Endpoint::Pod {
        pod: Key::new("bench", name),
        ip: ip.parse().expect("address"),
    };
    let (client, server) = (end("client", "10.244.1.5"), end("server", "10.244.2.5"));
    for (policies, prefixes) in [(1, 0), (10, 0), (1_000, 0), (1, 10_000)] {
        let c = bench_cluster(policies, prefixes);
        let n = 2_000u32;
        let t = Instant::now();
        for _ in 0..n {
            assert!(allowed(&c, &client, &server, Protocol::Tcp, 5001).is_allowed());
        }
        eprintln!(
            "{policies:>5} policies, {prefixes:>6} prefixes: {:.1?} per allowed()",
            t.elapsed() / n
        );
    }
}
