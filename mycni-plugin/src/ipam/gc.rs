//! Reading the lease store back: the listing, and CNI GC, which frees what no live
//! container holds. Apart from the store's API because neither allocates, and GC is the
//! one caller that decides by a whole set of owners.

use std::collections::HashSet;

use super::error::StoreError;
use super::lease::{Lease, Owner};
use super::store::LeaseStore;

impl LeaseStore {
    /// Taken under the lock so the listing is a consistent snapshot. Sorted by IP.
    pub fn leases(&self) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .lock()?
            .read_leases()?
            .into_iter()
            .map(|(ip, owner)| owner.into_lease(ip))
            .collect())
    }

    /// Frees leases leaked by containers that were never DELeted (node crash, runtime bug).
    /// A lease of unknown interface (old host-local format) is kept if its container is kept
    /// with any interface, so a live container's IP is never freed for lack of an ifname.
    /// Garbage leases are always freed: no container can be shown to own them.
    pub fn gc(&self, keep: &HashSet<(String, String)>) -> Result<Vec<Lease>, StoreError> {
        let locked = self.lock()?;
        let keep_pairs: HashSet<(&str, &str)> =
            keep.iter().map(|(c, i)| (c.as_str(), i.as_str())).collect();
        let keep_ids: HashSet<&str> = keep.iter().map(|(c, _)| c.as_str()).collect();
        let mut released = Vec::new();
        for (ip, owner) in locked.read_leases()? {
            let kept = match &owner {
                Owner::Known {
                    id,
                    ifname: Some(i),
                } => keep_pairs.contains(&(id.as_str(), i.as_str())),
                Owner::Known { id, ifname: None } => keep_ids.contains(id.as_str()),
                Owner::Garbage => false,
            };
            if !kept && locked.remove_lease(ip)? {
                released.push(owner.into_lease(ip));
            }
        }
        Ok(released)
    }
}
