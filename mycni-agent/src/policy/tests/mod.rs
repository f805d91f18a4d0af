//! Tests of the policy module: the upstream truth tables, the rules list,
//! the converter on garbage, the time-ordered cases, and a property test
//! against a naive evaluator.

mod convert;
pub(crate) mod fixture;
mod naive;
mod prop;
mod rules;
mod timeline;
mod upstream;
