//! Property tests of everything the plugin parses from its caller: the
//! network config (with prevResult), CNI_ARGS and results. Whatever the
//! input, parsing returns a value or a spec-coded error; it never panics.

use mycni_plugin::config::{CniArgs, NetConf};
use mycni_plugin::types::CniResult;
use mycni_plugin::version::Version;
use proptest::prelude::*;
use serde_json::{Value, json};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,20}".prop_map(Value::from),
        prop_oneof![
            Just("10.244.1.5/32"),
            Just("1.1.0"),
            Just("0.3.1"),
            Just("mycni-ipam"),
            Just("fd00::1/64"),
            Just("10.0.0.0/33"),
            Just("169.254.1.1"),
            Just("fe80::1"),
            Just("::/0"),
            Just("eth0")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("cniVersion".to_string()),
                    Just("name".to_string()),
                    Just("type".to_string()),
                    Just("ipam".to_string()),
                    Just("prevResult".to_string()),
                    Just("mtu".to_string()),
                    Just("ips".to_string()),
                    Just("address".to_string()),
                    Just("routes".to_string()),
                    Just("dst".to_string()),
                    Just("gw".to_string()),
                    Just("interfaces".to_string()),
                    Just("cni.dev/valid-attachments".to_string()),
                    Just("subnet".to_string()),
                    Just("ranges".to_string()),
                    Just("gateway".to_string()),
                    Just("version".to_string()),
                    ".{0,8}"
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn config_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = NetConf::parse(&bytes) {
            prop_assert!(!e.msg.is_empty());
        }
    }

    #[test]
    fn config_json_never_panics(v in arb_json()) {
        let _ = NetConf::parse(v.to_string().as_bytes());
    }

    #[test]
    fn config_with_prev_result_never_panics(prev in arb_json(), mtu in any::<i64>()) {
        let conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "mycni", "mtu": mtu,
            "ipam": {"type": "mycni-ipam", "subnet": "10.244.1.0/24"}, "prevResult": prev});
        if let Ok(c) = NetConf::parse(conf.to_string().as_bytes())
            && let Some(p) = &c.prev_result
        {
            let _ = CniResult::from_json(p);
        }
    }

    #[test]
    fn results_never_panic_and_round_trip(v in arb_json()) {
        if let Ok(r) = CniResult::from_json(&v) {
            for ver in [Version::V0_3_1, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0] {
                let again = CniResult::from_json(&r.to_json(ver));
                prop_assert!(again.is_ok());
                let again = again.map_err(|e| TestCaseError::fail(e.msg))?;
                prop_assert_eq!(&again.ips, &r.ips);
            }
        }
    }

    #[test]
    fn cni_args_never_panic(s in ".{0,200}") {
        let _ = CniArgs::parse(&s);
    }

    #[test]
    fn cni_args_known_keys_round_trip(ns in "[a-z0-9-]{1,20}", name in "[a-z0-9.-]{1,30}") {
        let a = CniArgs::parse(&format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};X=y"))
            .map_err(|e| TestCaseError::fail(e.msg))?;
        prop_assert_eq!(a.pod_namespace.as_deref(), Some(ns.as_str()));
        prop_assert_eq!(a.pod_name.as_deref(), Some(name.as_str()));
    }
}
