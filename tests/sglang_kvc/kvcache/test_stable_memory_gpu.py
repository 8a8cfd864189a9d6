"""stable_memory.StableMemory on a GPU (skipped without one): the address survives unmap/map,
the memory really goes back to the driver, a mapped range is zeroed, and a KVPool built on it
keeps K/V where they were with the same contents semantics as a torch-allocated pool."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MIB = 1 << 20


def test_range_keeps_its_address_and_gives_memory_back():
    from sglang_kvc.kvcache.stable_memory import StableMemory, mapped_bytes

    dev = torch.device("cuda", torch.cuda.current_device())
    mem = StableMemory(64 * MIB + 123, dev)
    assert not mem.mapped  # reserved only: no physical memory yet
    mem.map()
    base = mem.address
    x = mem.tensor(torch.float32)
    assert x.data_ptr() == base and x.numel() == (64 * MIB + 123) // 4
    assert int(x.abs().max()) == 0  # mapped zeroed
    x.fill_(3.0)
    assert mapped_bytes(dev) >= 64 * MIB
    del x
    free_mapped = torch.cuda.mem_get_info(dev)[0]
    mem.unmap()
    assert torch.cuda.mem_get_info(dev)[0] - free_mapped >= 64 * MIB
    mem.map()
    y = mem.tensor(torch.float32)
    assert y.data_ptr() == base and int(y.abs().max()) == 0
    del y
    mem.close()


def test_dropped_ranges_are_closed_at_the_next_safe_point():
    from sglang_kvc.kvcache import stable_memory

    dev = torch.device("cuda", torch.cuda.current_device())
    before = stable_memory.mapped_bytes(dev)
    mem = stable_memory.StableMemory(32 * MIB, dev)
    mem.map()
    del mem
    gc.collect()
    assert stable_memory._DROPPED  # queued, not unmapped from the collector
    stable_memory.close_dropped()
    assert stable_memory.mapped_bytes(dev) == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_stable_pool_matches_a_torch_pool(dtype):
    from sglang_kvc.kvcache.kv_cache import KVPool

    dev = torch.device("cuda")
    args = (1000, 3, 2, 64, dtype, dev)
    plain, stable = KVPool(*args, compute_dtype=torch.bfloat16), KVPool(*args, compute_dtype=torch.bfloat16,
                                                                      stable_address=True)
    assert stable.stable is not None and stable.bytes == plain.bytes
    ptrs = (stable.k.data_ptr(), stable.v.data_ptr())
    g = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.randperm(999, device="cuda", generator=g)[:300] + 1
    k = torch.randn(300, 2, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(300, 2, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    for layer in range(3):
        for pool in (plain, stable):
            pool.write(layer, slots, k * (layer + 1), v - layer)
    for layer in range(3):
        for a, b in zip(plain.read(layer, slots), stable.read(layer, slots)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    stable.release()
    stable.allocate()
    assert (stable.k.data_ptr(), stable.v.data_ptr()) == ptrs
    assert int(stable.k.view(torch.uint8).max()) == 0 and int(stable.v.view(torch.uint8).max()) == 0
