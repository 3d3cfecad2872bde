"""Tensor-parallel layout without devices: divisibility checks, the shard-major packing of
the fused matrices, the partition specs of every weight, and XLA flag merging."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from local_tier.jax import backend, sharding
from local_tier.jax import model as M
from local_tier.jax.gguf_loader import HParams
from local_tier.jax.quant import QuantMatrix
from local_tier.jax.sharding import P


def hparams(n_heads: int = 9, n_kv_heads: int = 3, d_ff: int = 1536) -> HParams:
    """SmolLM2-135M's shape unless changed."""
    return HParams(
        n_layers=1,
        d_model=576,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=64,
        d_ff=d_ff,
        vocab_size=49152,
        context_length=2048,
        rope_base=1e5,
        rms_eps=1e-5,
    )


def test_smollm2_splits_only_into_one_or_three() -> None:
    hp = hparams()
    assert sharding.valid_tensor_parallel(hp) == [1, 3]
    sharding.check_tensor_parallel(hp, 3)
    with pytest.raises(ValueError, match=r"EngineConfig.tensor_parallel=2 must divide") as err:
        sharding.check_tensor_parallel(hp, 2)
    assert "KV heads (3)" in str(err.value) and "tensor_parallel in [1, 3]" in str(err.value)


def test_mlp_width_and_heads_limit_the_split_too() -> None:
    assert sharding.valid_tensor_parallel(hparams(32, 8, 14336)) == [1, 2, 4, 8]  # Llama 3 8B
    assert sharding.valid_tensor_parallel(hparams(8, 4, 6)) == [1, 2]  # d_ff 6: not 4
    with pytest.raises(ValueError, match="MLP width \\(6\\)"):
        sharding.check_tensor_parallel(hparams(8, 4, 6), 4)
    with pytest.raises(ValueError, match=">= 1"):
        sharding.check_tensor_parallel(hparams(), 0)


def unshard_major(x: np.ndarray, sizes: list[int], tp: int) -> list[np.ndarray]:
    """The inverse of ``shard_major``: the parts back from shard-major rows."""
    shards = np.split(x, tp, axis=0)
    ends = np.cumsum([n // tp for n in sizes])
    return [
        np.concatenate([s[e - n // tp : e] for s in shards], axis=0)
        for n, e in zip(sizes, ends, strict=True)
    ]


def test_shard_major_puts_each_shards_heads_together() -> None:
    q = np.arange(8).reshape(8, 1)  # 4 heads of 2 rows
    k = 100 + np.arange(4).reshape(4, 1)  # 2 heads of 2 rows
    v = 200 + np.arange(4).reshape(4, 1)
    packed = M.shard_major([q, k, v], 2)[:, 0].tolist()
    assert packed == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    np.testing.assert_array_equal(M.shard_major([q, k, v], 1), np.concatenate([q, k, v]))


@given(
    tp=st.sampled_from([1, 2, 3, 4]),
    units=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    cols=st.integers(1, 3),
)
def test_shard_major_round_trips(tp: int, units: list[int], cols: int) -> None:
    sizes = [u * tp for u in units]
    rng = np.random.default_rng(sum(sizes))
    parts = [rng.standard_normal((n, cols)) for n in sizes]
    packed = M.shard_major(parts, tp)
    assert packed.shape == (sum(sizes), cols)
    for got, want in zip(unshard_major(packed, sizes, tp), parts, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_columns_undoes_shard_major_on_the_last_axis(tp: int) -> None:
    sizes = (8, 4, 4)
    parts = [np.arange(n, dtype=np.float32) + 100 * i for i, n in enumerate(sizes)]
    fused = M.shard_major(parts, tp)[None, None]  # (1, 1, columns): a matmul's output
    got = M._split_columns(jnp.asarray(fused), sizes, tp)
    for g, want in zip(got, parts, strict=True):
        np.testing.assert_array_equal(np.asarray(g)[0, 0], want)


def layer(quant: bool, biases: bool) -> M.LayerWeights:
    def mat(shape: tuple[int, int]) -> np.ndarray | QuantMatrix:
        w = np.ones(shape, np.float32)
        return QuantMatrix(w.astype(np.int8), w[0]) if quant else w

    vec = np.ones(4, np.float32)
    return M.LayerWeights(
        vec, vec, mat((4, 8)), mat((4, 4)), mat((4, 8)), mat((4, 4)),
        b_qkv=vec if biases else None, b_o=vec if biases else None,
    )  # fmt: skip


def test_weight_specs_split_columns_then_rows_and_replicate_the_rest() -> None:
    w = M.Weights(np.ones((4, 32)), np.ones(4), (layer(False, True),), np.ones(2))
    specs = sharding.weight_specs(w)
    lw = specs.layers[0]
    assert (lw.w_qkv, lw.w_gu, lw.b_qkv) == (P(None, "tp"), P(None, "tp"), P("tp"))
    assert (lw.w_o, lw.w_down) == (P("tp", None), P("tp", None))
    assert (specs.emb_t, specs.out_norm, specs.rope_inv, lw.attn_norm, lw.b_o) == (P(),) * 5
    assert specs.emb_in is None


def test_int8_scales_follow_their_output_columns() -> None:
    lw = sharding.layer_specs(layer(True, False))
    assert lw.w_qkv == QuantMatrix(P(None, "tp"), P("tp"))  # column-parallel: split scales
    assert lw.w_down == QuantMatrix(P("tp", None), P())  # row-parallel: whole output
    assert lw.b_qkv is None and lw.b_o is None


def test_one_device_is_placed_plainly_not_on_a_mesh() -> None:
    import jax

    placement = sharding.as_placement(jax.devices()[0])
    assert placement.mesh is None and placement.tp == 1
    assert placement.cache is placement.device and placement.replicated is placement.device
    assert sharding.as_placement(placement) is placement
    with pytest.raises(ValueError, match="at least one device"):
        sharding.Placement.on([])


def test_model_spec_defaults_to_one_shard() -> None:
    spec = M.ModelSpec(hparams(), n_blocks=2, block_size=16)
    assert spec.tp == 1 and dataclasses.replace(spec, tp=3).tp == 3


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (None, backend.CPU_FLAGS),
        ("", backend.CPU_FLAGS),
        (
            "--xla_force_host_platform_device_count=8",
            "--xla_force_host_platform_device_count=8 " + backend.CPU_FLAGS,
        ),
        (  # a flag the user sets keeps the user's value
            "--xla_cpu_enable_concurrency_optimized_scheduler=true",
            "--xla_cpu_enable_concurrency_optimized_scheduler=true"
            " --xla_cpu_copy_insertion_use_region_analysis=true",
        ),
        (backend.CPU_FLAGS, backend.CPU_FLAGS),
    ],
)
def test_cpu_flags_are_added_to_a_users_xla_flags(user: str | None, expected: str) -> None:
    assert backend.merged_xla_flags(user) == expected


def test_asking_for_more_devices_than_exist_names_the_fields() -> None:
    import jax

    have = len(jax.devices("cpu"))
    assert backend.select_devices("cpu", have) == jax.devices("cpu")
    with pytest.raises(backend.BackendError, match="tensor_parallel x data_parallel") as err:
        backend.select_devices("cpu", have + 1)
    assert "xla_force_host_platform_device_count" in str(err.value)
