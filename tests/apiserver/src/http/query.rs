//! Query strings, decoded the way Go's `url.ParseQuery` does.

use crate::store::ApiError;
use crate::store::{FieldSelector, Kind, LabelSelector, Selectors};

/// Decoded query parameters.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        Self(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (pct_decode(k), pct_decode(v))
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub(super) fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    pub(super) fn selectors(&self, kind: Kind) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
                .map_err(|e| ApiError::bad_request(&e))?,
            fields: FieldSelector::parse(kind, self.get("fieldSelector").unwrap_or_default())
                .map_err(|e| ApiError::bad_request(&e))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "&labelSelector=a%3Db%2Cc&fieldSelector=metadata.name%3Dx&watch=1&x=a+b&bad=%zz&end=%4",
        ));
        assert_eq!(q.get("labelSelector"), Some("a=b,c"));
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=x"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("x"), Some("a b"));
        assert_eq!(q.get("bad"), Some("%zz"));
        assert_eq!(q.get("end"), Some("%4"));
    }
}
