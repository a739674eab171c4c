//! The `uvm-status` scenario.
use super::*;

/// The UVM calls whose layout moved between branches, each with an answer that
/// is not NV_OK where the driver has one: UVM_MAP_EXTERNAL_ALLOCATION into no
/// range (NV_ERR_INVALID_ADDRESS), UVM_ALLOC_SEMAPHORE_POOL (NV_OK) and UVM_FREE
/// of no range (NV_ERR_INVALID_ADDRESS), in buffers of the branch's size with
/// every other byte 0xff (a status read at another branch's offset is then
/// 0xffffffff). Prints `uvm_status NAME 0x..` per call, read where the branch's
/// driver writes it.
pub(crate) fn uvm_status(env: &Env) {
    let u = env.open("nvidia-uvm", false);
    let mut p = vec![0u8; uvm::INITIALIZE_SIZE];
    expect_ok(
        "UVM_INITIALIZE",
        env.uvm(u, uvm::INITIALIZE, &mut p, Some(uvm::INITIALIZE_RM_STATUS)),
    );
    let v = env.version;
    for (name, cmd, (len, status)) in [
        (
            "UVM_MAP_EXTERNAL_ALLOCATION",
            uvm::MAP_EXTERNAL_ALLOCATION,
            abi::branch::uvm_map_external(v),
        ),
        (
            "UVM_ALLOC_SEMAPHORE_POOL",
            uvm::ALLOC_SEMAPHORE_POOL,
            abi::branch::uvm_semaphore_pool(v),
        ),
        ("UVM_FREE", uvm::FREE, abi::branch::uvm_free(v)),
    ] {
        let mut p = vec![0xffu8; len];
        put_u64(&mut p, 0, 7 << 40);
        put_u64(&mut p, 8, 1 << 21);
        let st = env.uvm(u, cmd, &mut p, Some(status));
        println!("uvm_status {name} {st:#x}");
        let want = if cmd == uvm::ALLOC_SEMAPHORE_POOL {
            status::NV_OK
        } else {
            status::NV_ERR_INVALID_ADDRESS
        };
        if st != want {
            die(&format!("{name}: status {st:#x}, expected {want:#x}"));
        }
    }
}
