//! `run`'s policy flag: whether the agent enforces NetworkPolicy.

use clap::Args;
use mycni_agent::settings::NETWORK_POLICY;

use super::order::Order;
use super::values::parse_bool;

#[derive(Args, Clone)]
pub(super) struct PolicyArgs {
    /// Enforce Kubernetes NetworkPolicy (networking.k8s.io/v1) in the
    /// nftables table `inet mycni_policy`; false removes the table.
    #[arg(long = NETWORK_POLICY.flag, env = NETWORK_POLICY.env, default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_network_policy, display_order = Order::NetworkPolicy as usize)]
    pub network_policy: bool,
}

fn parse_network_policy(s: &str) -> Result<bool, String> {
    NETWORK_POLICY.check(parse_bool(s))
}
