use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::cluster::model::Key;
use crate::verdict::Direction;

/// A tiny deterministic generator: the property needs variety, not
/// cryptographic randomness.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    fn addr(&mut self) -> Ipv4Addr {
        Ipv4Addr::new(
            10,
            self.next(2) as u8,
            self.next(4) as u8,
            self.next(16) as u8,
        )
    }

    fn prefix(&mut self) -> Cidr {
        let len = [8u8, 16, 24, 28, 30, 32][self.next(6) as usize];
        let a = self.addr();
        Cidr::new(a.into(), len).unwrap_or_else(|| Cidr::host(a.into()))
    }
}

fn rules() -> Vec<RuleRef> {
    (0..4)
        .map(|i| RuleRef {
            policy: Key::new("x", format!("p{}", i % 2)),
            direction: Direction::Ingress,
            index: i,
        })
        .collect()
}

const PROTOS: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];

/// Whatever the overlaps, the elements admit exactly the union of the
/// allows, no (address, protocol, port) twice in a map (the kernel would
/// refuse it), and each admitted packet is counted under the first rule
/// that admits it, the ported map being looked at before the any map.
#[test]
fn elements_admit_the_union_once_under_the_first_rule() {
    let rules = rules();
    let mut rng = Lcg(11);
    for _ in 0..400 {
        let any: Vec<(Cidr, &RuleRef)> = (0..rng.next(3))
            .map(|_| (rng.prefix(), &rules[rng.next(4) as usize]))
            .collect();
        let ported: Vec<Ported> = (0..1 + rng.next(6))
            .map(|_| {
                let s = rng.next(100) as u16;
                (
                    rng.prefix(),
                    PROTOS[rng.next(2) as usize],
                    s,
                    s + rng.next(20) as u16,
                    &rules[rng.next(4) as usize],
                )
            })
            .collect();
        let out = split(&any, &ported);
        for _ in 0..300 {
            let ip: IpAddr = rng.addr().into();
            let proto = PROTOS[rng.next(2) as usize];
            let port = rng.next(130) as u16;
            let covering = |c: &Cidr, p: Protocol, s: u16, e: u16| {
                c.contains(ip) && p == proto && (s..=e).contains(&port)
            };
            let want = any
                .iter()
                .filter(|(c, _)| c.contains(ip))
                .map(|(_, r)| *r)
                .chain(
                    ported
                        .iter()
                        .filter(|(c, p, s, e, _)| covering(c, *p, *s, *e))
                        .map(|(.., r)| *r),
                )
                .min();
            let hits: Vec<&RuleRef> = out
                .ported
                .iter()
                .filter(|(c, p, s, e, _)| covering(c, *p, *s, *e))
                .map(|(.., r)| *r)
                .collect();
            let any_hits: Vec<&RuleRef> = out
                .any
                .iter()
                .filter(|(c, _)| c.contains(ip))
                .map(|(_, r)| *r)
                .collect();
            let case = || format!("{ip} {proto:?} {port}: {out:?} from {any:?} {ported:?}");
            assert!(hits.len() <= 1 && any_hits.len() <= 1, "{}", case());
            let got = hits.first().or(any_hits.first()).copied();
            assert_eq!(got, want, "{}", case());
        }
    }
}

#[test]
fn one_rule_keeps_one_element() {
    let r = &rules()[0];
    let wide = Cidr::new("10.0.0.0".parse().expect("ip"), 8).expect("cidr");
    let host = Cidr::host("10.1.2.3".parse().expect("ip"));
    // A prefix inside another of the same rule adds nothing.
    let out = split(&[(wide, r), (host, r)], &[(host, Protocol::Tcp, 80, 80, r)]);
    assert_eq!(out.any, vec![(wide, r)]);
    assert!(out.ported.is_empty(), "{out:?}");
    // Touching ranges of one rule are one segment.
    let out = split(
        &[],
        &[
            (host, Protocol::Tcp, 80, 80, r),
            (host, Protocol::Tcp, 81, 90, r),
        ],
    );
    assert_eq!(out.ported, vec![(host, Protocol::Tcp, 80, 90, r)]);
}

#[test]
fn an_earlier_rule_inside_a_later_one_is_carved_out() {
    let rs = rules();
    let wide = Cidr::new("10.0.0.0".parse().expect("ip"), 30).expect("cidr");
    let host = Cidr::host("10.0.0.1".parse().expect("ip"));
    let out = split(&[(wide, &rs[1]), (host, &rs[0])], &[]);
    let mut any = out.any.clone();
    any.sort();
    assert_eq!(
        any.iter()
            .map(|(c, r)| (c.to_string(), r.index))
            .collect::<Vec<_>>(),
        vec![
            ("10.0.0.0/32".to_string(), 1),
            ("10.0.0.1/32".to_string(), 0),
            ("10.0.0.2/31".to_string(), 1),
        ]
    );
}
