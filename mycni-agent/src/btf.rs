//! What the agent's own BTF readers share: the size of each type record.
//! aya's parser keeps enum variants and type counts to itself, so the drop
//! reasons' names (`flows::kdrop_names`) and the kfunc loader's split-BTF
//! ids (`datapath::kfuncs`) walk the type section themselves.

// BTF kinds (include/uapi/linux/btf.h) and what follows each `btf_type`.
pub(crate) const KIND_INT: u32 = 1;
pub(crate) const KIND_ARRAY: u32 = 3;
pub(crate) const KIND_STRUCT: u32 = 4;
pub(crate) const KIND_UNION: u32 = 5;
pub(crate) const KIND_ENUM: u32 = 6;
pub(crate) const KIND_FUNC_PROTO: u32 = 13;
pub(crate) const KIND_VAR: u32 = 14;
pub(crate) const KIND_DATASEC: u32 = 15;
pub(crate) const KIND_DECL_TAG: u32 = 17;
pub(crate) const KIND_ENUM64: u32 = 19;
/// The last kind this reader knows; a record of a later one cannot be
/// stepped over.
pub(crate) const KIND_MAX: u32 = 19;

/// Bytes that follow a `btf_type` of `kind` with `vlen` members.
pub(crate) fn trailer(kind: u32, vlen: usize) -> usize {
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        _ => 0,
    }
}
