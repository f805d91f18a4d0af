//! The NetworkPolicy epoch the fast path holds established flows to
//! (`mycni_common::POLICY_MARK_SHIFT`): the policy room publishes it once
//! nftables stamps connections with it, the datapath's programs compare
//! each flow's stamp with it. The loop hands the policy room a
//! [`PolicyEpoch`], so the room knows there is somewhere to publish, not
//! whose map it is.

/// Where the policy room publishes its epoch.
pub trait PolicyEpoch: Send + Sync {
    /// The epoch last published, None where nothing holds one (the kernel
    /// path, or programs not loaded yet).
    fn read(&self) -> Option<u32>;
    /// Publishes `epoch` (0: check no stamp). False when nothing holds it.
    fn write(&self, epoch: u32) -> anyhow::Result<bool>;
}
