//! `prevResult` and delegated IPAM results: bytes -> JSON -> `CniResult`,
//! as CHECK reads `prevResult` and ADD reads an IPAM plugin's stdout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mycni_plugin::error::Code;
use mycni_plugin::types::CniResult;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    match CniResult::from_json(&v) {
        Ok(r) => mycni_fuzz::check_result(&v, &r),
        Err(e) => {
            assert!(!e.msg.is_empty());
            assert!(
                matches!(e.code, Code::Decode | Code::UnsupportedField),
                "{:?}: {}",
                e.code,
                e.msg
            );
        }
    }
});
