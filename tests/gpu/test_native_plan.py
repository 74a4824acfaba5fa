"""The cached call plans of native.quantize / native.gemm on the GPU (native/plan.py, docs/design.md §4.1).

For every scheme and variant: the first call of a signature runs the full path and records a plan; the second and
third calls (planned) give bytes identical to the first and to the golden reference (every field, scale padding
included); calls of other signatures never reuse a wrong plan; a later call with bad input raises the exception
and message the full path raises; every call returns fresh storage; the SR seed, a given amax and the fp8_delayed
state are read per call. GEMMs: planned calls equal the full path (plans off) bit for bit, on new operands too.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch

import reference
from reference.formats import QuantConfig
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor, SpecViolation, SRSeed
from tests.gpu.test_native_features import assert_same, make_x, seed_of

pytestmark = pytest.mark.gpu

CONFIGS = {
    "fp8_current": QuantConfig("fp8_current"),
    "fp8_current-e5m2-pow2": QuantConfig("fp8_current", element="e5m2", pow2_scales=True, eps=2.0**-20),
    "fp8_delayed": QuantConfig("fp8_delayed"),
    "mxfp8": QuantConfig("mxfp8"),
    "mxfp8-e5m2": QuantConfig("mxfp8", element="e5m2"),
    "fp8_block-1x128": QuantConfig("fp8_block"),
    "fp8_block-128x128": QuantConfig("fp8_block", tile=(128, 128)),
    "nvfp4-1x16": QuantConfig("nvfp4"),
    "nvfp4-16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "nvfp4-rht": QuantConfig("nvfp4", rht=True),
    "nvfp4-sr": QuantConfig("nvfp4", stochastic=True),
    "nvfp4-rht-sr": QuantConfig("nvfp4", rht=True, stochastic=True),
    "nvfp4-16x16-sr": QuantConfig("nvfp4", tile=(16, 16), stochastic=True),
    "nvfp4-4over6": QuantConfig("nvfp4", variant="4over6"),
    "nvfp4-16x16-4over6": QuantConfig("nvfp4", tile=(16, 16), variant="4over6"),
    "nvfp4-row_scaled": QuantConfig("nvfp4", variant="row_scaled"),
    "nvfp4-row_scaled_4over6": QuantConfig("nvfp4", variant="row_scaled_4over6"),
}
GIVEN = ("fp8_current", "fp8_current-e5m2-pow2", "nvfp4-1x16", "nvfp4-16x16", "nvfp4-sr", "nvfp4-4over6")
COPIES = {"both": (True, True), "rowwise": (True, False), "colwise": (False, True)}
SEED = SRSeed(0x0123456789ABCDEF, 0xFFFFFFFF)


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.fixture(autouse=True)
def _fresh_plans():
    import native

    native.use_plans(True)
    native.clear_plans()
    yield
    native.use_plans(True)
    native.clear_plans()


def plans():
    return sys.modules["native.plan"]


def call_kwargs(cfg: QuantConfig, x: torch.Tensor, *, given: bool, rng=SEED) -> dict:
    kw = {}
    if cfg.stochastic:
        kw["rng"] = rng
    if given:
        kw["amax"] = x.abs().to(torch.float32).amax().reshape(1) * 1.5
    return kw


def storages(q) -> set[int]:
    return {t.untyped_storage().data_ptr() for o in ("rowwise", "colwise") for f in ("data", "scale", "amax")
            if (t := getattr(q, f"{o}_{f}")) is not None}  # fmt: skip


def copies_allowed(cfg: QuantConfig, copies: str) -> bool:
    return not (cfg.variant == "row_scaled_4over6" and COPIES[copies][1])


def shapes_of(cfg: QuantConfig) -> list[tuple[int, int]]:
    return [(256, 256), (128, 96)] if not cfg.scheme_row.partial_tiles else [(256, 256), (200, 136)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_planned_calls_equal_the_first_and_the_golden(name, given, copies, dtype):
    import native

    cfg = CONFIGS[name]
    if given and name not in GIVEN:
        pytest.skip("no given amax for this config (reference.spec.check_given_amax)")
    if cfg.rht and dtype != torch.bfloat16:
        pytest.skip("RHT needs bfloat16 (reference.spec)")
    if not copies_allowed(cfg, copies):
        pytest.skip("row-scaled 4over6 has no columnwise copy")
    rw, cw = COPIES[copies]
    for shape in shapes_of(cfg):
        native.clear_plans()
        x = make_x(shape, dtype, seed=seed_of(name, shape, dtype))
        xd = x.cuda()
        kw = call_kwargs(cfg, x, given=given)
        dev_kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        gold_state = AmaxHistory(cfg) if cfg.scheme == "fp8_delayed" else None
        gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, state=gold_state, **kw)
        outs = []
        for i in range(3):
            state = AmaxHistory(cfg, device=xd.device) if gold_state is not None else None
            q = native.quantize(xd, cfg, rowwise=rw, colwise=cw, state=state, **dev_kw)
            label = f"{name} {shape} {dtype} {copies} given={given} call {i + 1}"
            assert_same(gold, q, label)
            if state is not None:  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) on every call, planned or not
                assert torch.equal(state.history.cpu().view(torch.int32), gold_state.history.view(torch.int32)), label
            assert len(plans().QUANTIZE_PLANS) == 1, f"{label}: the first call records one plan, later ones reuse it"
            outs.append(q)
        assert not (storages(outs[0]) & storages(outs[1])) and not (storages(outs[1]) & storages(outs[2]))
        for q in outs:  # a later call never writes into an earlier call's outputs
            assert_same(gold, q, f"{name} {shape} after three calls")


def test_other_signatures_never_reuse_a_plan():
    """Alternating signatures (shape, config, copies, dtype, given amax, alignment, contiguity) each match the golden."""
    import native

    base = make_x((256, 256), torch.bfloat16, seed=1)
    signatures = [
        (base, CONFIGS["nvfp4-1x16"], True, True, {}),
        (make_x((128, 256), torch.bfloat16, seed=2), CONFIGS["nvfp4-1x16"], True, True, {}),
        (base, CONFIGS["nvfp4-16x16"], True, True, {}),
        (base, CONFIGS["nvfp4-1x16"], True, False, {}),
        (base, CONFIGS["nvfp4-1x16"], False, True, {}),
        (base.float(), CONFIGS["nvfp4-1x16"], True, True, {}),
        (base, CONFIGS["nvfp4-1x16"], True, True, {"amax": torch.tensor([7.0])}),
        (base, CONFIGS["fp8_current"], True, True, {}),
        (base, CONFIGS["mxfp8"], True, True, {}),
        (base, CONFIGS["fp8_block-1x128"], True, True, {}),
    ]
    for _ in range(2):
        for x, cfg, rw, cw, kw in signatures:
            gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, **kw)
            dev_kw = {k: v.cuda() for k, v in kw.items()}
            assert_same(gold, native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, **dev_kw), f"{cfg.id} {x.shape}")
    assert len(plans().QUANTIZE_PLANS) == len(signatures)
    # Alignment and contiguity: a misaligned view and a transposed view of the same values, after the plan of an
    # aligned contiguous input (the vector-width flags and nvfp4's copy of a misaligned X are per key).
    for cfg in (CONFIGS["fp8_current"], CONFIGS["mxfp8"], CONFIGS["fp8_block-1x128"], CONFIGS["nvfp4-1x16"]):
        gold = reference.quantize(base, cfg, rowwise=True, colwise=True)
        flat = torch.empty(base.numel() + 1, dtype=base.dtype, device="cuda")
        flat[1:] = base.cuda().flatten()
        misaligned = flat[1:].view(base.shape)
        assert misaligned.data_ptr() % 16
        transposed = base.t().contiguous().cuda().t()
        for x in (base.cuda(), misaligned, transposed, base.cuda(), misaligned, transposed):
            assert_same(gold, native.quantize(x, cfg, rowwise=True, colwise=True), f"{cfg.id} {x.stride()}")


def test_a_second_device_gets_its_own_plan():
    import native

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = CONFIGS["nvfp4-sr"]
    x = make_x((256, 256), torch.bfloat16, seed=5)
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True, rng=SEED)
    current = torch.cuda.current_device()
    for dev in ("cuda:0", "cuda:1", "cuda:0", "cuda:1"):
        q = native.quantize(x.to(dev), cfg, rowwise=True, colwise=True, rng=SEED)
        assert q.rowwise_data.device == torch.device(dev)
        assert_same(gold, q, dev)
        assert torch.cuda.current_device() == current
    assert len(plans().QUANTIZE_PLANS) == 2


def error_of(fn) -> tuple[type, str]:
    try:
        fn()
    except Exception as e:  # the type and message are what is compared
        return type(e), str(e)
    raise AssertionError("no exception")


@pytest.mark.parametrize("name", ["fp8_current", "fp8_delayed", "mxfp8", "fp8_block-1x128", "nvfp4-sr", "nvfp4-4over6"])
def test_bad_input_after_a_plan_raises_what_the_full_path_raises(name):
    import native

    cfg = CONFIGS[name]
    x = make_x((256, 256), torch.bfloat16, seed=7).cuda()
    rng = SEED if cfg.stochastic else None
    state = (lambda: AmaxHistory(cfg, device=x.device)) if cfg.scheme == "fp8_delayed" else (lambda: None)
    bad_calls = {
        "float64": lambda: native.quantize(x.double(), cfg, rng=rng, state=state()),
        "cpu": lambda: native.quantize(x.cpu(), cfg, rng=rng, state=state()),
        "partial K": lambda: native.quantize(x[:, :200], cfg, rng=rng, state=state()),
        "no copies": lambda: native.quantize(x, cfg, rowwise=False, colwise=False, rng=rng, state=state()),
        "bad seed": lambda: native.quantize(x, cfg, rng=(2**64, 0), state=state()),
        "negative host amax": lambda: native.quantize(x, cfg, rng=rng, state=state(), amax=torch.tensor([-1.0])),
        # (a device amax: the planned call's quick check takes only fp32 [] / [1]; the rest is check_given_amax's)
        "device amax [2]": lambda: native.quantize(x, cfg, rng=rng, state=state(), amax=torch.ones(2, device="cuda")),
        "device amax [1, 1]": lambda: native.quantize(x, cfg, rng=rng, state=state(),
                                                      amax=torch.ones(1, 1, device="cuda")),  # fmt: skip
        "device amax fp64": lambda: native.quantize(x, cfg, rng=rng, state=state(),
                                                    amax=torch.ones(1, device="cuda", dtype=torch.float64)),  # fmt: skip
        "amax not a tensor": lambda: native.quantize(x, cfg, rng=rng, state=state(), amax=1.0),
        "wrong state": lambda: native.quantize(x, cfg, rng=rng, state=AmaxHistory(QuantConfig("fp8_delayed", margin=1))),
    }
    if cfg.stochastic:
        bad_calls["no rng"] = lambda: native.quantize(x, cfg, rng=None)
    expected = {}
    native.use_plans(False)
    for what, call in bad_calls.items():
        try:
            call()
        except Exception as e:
            expected[what] = (type(e), str(e))
    native.use_plans(True)
    for _ in range(2):  # plan the good signatures (with and without an amax where one is taken)
        native.quantize(x, cfg, rng=rng, state=state())
        if name in GIVEN:
            native.quantize(x, cfg, rng=rng, state=state(), amax=torch.tensor([3.0]))
    assert len(plans().QUANTIZE_PLANS) >= 1
    for what, call in bad_calls.items():
        if what in expected:
            assert error_of(call) == expected[what], what
        else:  # the full path accepted it (e.g. a seed for a config without SR): so must the planned one
            call()
    assert {"float64", "cpu", "no copies"} <= set(expected) and issubclass(expected["cpu"][0], SpecViolation)


@pytest.mark.parametrize("name", ["nvfp4-sr", "nvfp4-rht-sr", "nvfp4-16x16-sr"])
def test_the_sr_seed_is_read_per_call(name):
    import native

    cfg = CONFIGS[name]
    x = make_x((256, 256), torch.bfloat16, seed=11)
    seeds = [SEED, SRSeed(1, 0), (0xFFFFFFFF00000001, 0xFFFFFFFE), 42]
    golds = [reference.quantize(x, cfg, rowwise=True, colwise=True, rng=s) for s in seeds]
    assert not torch.equal(golds[0].rowwise_data, golds[1].rowwise_data)  # the seeds do change the bits
    for _ in range(2):
        for s, gold in zip(seeds, golds, strict=True):
            assert_same(gold, native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, rng=s), f"{name} rng={s}")
    assert len(plans().QUANTIZE_PLANS) == 1


@pytest.mark.parametrize("name", GIVEN)
def test_a_given_amax_is_read_per_call(name):
    import native

    cfg = CONFIGS[name]
    x = make_x((256, 256), torch.bfloat16, seed=13)
    rng = SEED if cfg.stochastic else None
    a = x.abs().to(torch.float32).amax().reshape(1)
    amaxes = [a, a * 4, a * 0.25, torch.full((1,), float("inf")), torch.zeros(1)]
    golds = [reference.quantize(x, cfg, rowwise=True, colwise=True, rng=rng, amax=v) for v in amaxes]
    for _ in range(2):
        for v, gold in zip(amaxes, golds, strict=True):
            for dev_amax in (v, v.cuda(), v.cuda().reshape(())):  # a host amax (value checked per call), device ones
                q = native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, rng=rng, amax=dev_amax)
                assert_same(gold, q, f"{name} amax={float(v)} on {dev_amax.device}")


def test_the_delayed_state_is_read_and_written_per_call():
    import native

    cfg = CONFIGS["fp8_delayed"]
    x = make_x((256, 256), torch.bfloat16, seed=17)
    gold_state, state = AmaxHistory(cfg), AmaxHistory(cfg, device="cuda")
    for step in range(4):
        xs = x * (step + 1)
        gold = reference.quantize(xs, cfg, rowwise=True, colwise=True, state=gold_state)
        assert_same(gold, native.quantize(xs.cuda(), cfg, rowwise=True, colwise=True, state=state), f"step {step}")
        assert torch.equal(state.history.cpu().view(torch.int32), gold_state.history.view(torch.int32))
        gold_state.update()
        native.update_amax_history(state)
    assert len(plans().QUANTIZE_PLANS) == 1


@pytest.mark.parametrize("home", ["cuda", "cpu"])
@pytest.mark.parametrize("shape", [(1024, 2048), (200, 136), (16, 16)])
def test_the_delayed_cast_records_h0_for_any_h0_and_grid(home, shape):
    """The fp8_delayed cast's last CTA records H[0] <- fmax(H[0], amax(x)) (docs/numerics.md §2; a CUDA fp32 history)
    or record() does after the launch (a host history): for a grid of 128 CTAs, a partial one and a single CTA, an
    H[0] below, above, equal to amax(x) and NaN (ignored, §0.1), on the full path, planned calls and out=; the
    colwise copy's amax / sinv equal the rowwise ones; the other history entries are untouched."""
    import native

    cfg = CONFIGS["fp8_delayed"]
    x = make_x(shape, torch.bfloat16, seed=29)
    a = float(x.abs().to(torch.float32).amax())
    for h0 in (0.0, a * 0.5, a, a * 8.0, float("nan")):
        native.clear_plans()
        q = None
        for i in range(4):
            gold_state, state = AmaxHistory(cfg), AmaxHistory(cfg, device=home)
            for st in (gold_state, state):
                st.history[0], st.history[1], st.scale[0] = h0, 7.0, 2.0 ** (i - 1)
            gold = reference.quantize(x, cfg, rowwise=True, colwise=True, state=gold_state)
            out = {"out": q} if i == 3 else {}
            got = native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, state=state, **out)
            q = got if i == 2 else q
            label = f"{shape} on {home} H[0]={h0} call {i + 1}"
            assert_same(gold, got, label)
            assert torch.equal(state.history.cpu().view(torch.int32), gold_state.history.view(torch.int32)), label
            assert state.history.device.type == home and state.history.dtype == torch.float32, label
        assert len(plans().QUANTIZE_PLANS) == 1


def test_a_given_amax_changed_after_the_call_is_read_in_stream_order():
    """fp8_current's cast reads the caller's device amax itself (no copy, docs/numerics.md §1): a change of that
    tensor enqueued after the call (same stream) does not reach the result, and the result's amax is its own."""
    import native

    cfg = CONFIGS["fp8_current"]
    x = make_x((512, 512), torch.bfloat16, seed=31)
    a = x.abs().to(torch.float32).amax().reshape(1) * 2
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True, amax=a)
    xd = x.cuda()
    for i in range(3):
        given = a.cuda()
        q = native.quantize(xd, cfg, rowwise=True, colwise=True, amax=given)
        given.fill_(1.0)  # after the kernels, in stream order
        assert_same(gold, q, f"call {i + 1}")
        assert q.rowwise_amax.data_ptr() != given.data_ptr() and q.colwise_amax.data_ptr() != given.data_ptr()
    given = a.cuda()
    assert native.quantize(xd, cfg, rowwise=True, colwise=True, amax=given, out=q) is q
    del given  # freed after the call: its memory is reused only by work ordered after the cast
    torch.ones(1, device="cuda").mul_(3.0)
    assert_same(gold, q, "out=")


# ---- out=: the in-place call -----------------------------------------------------------------------------------


def pointers(q) -> dict[str, int]:
    return {f"{o}_{f}": t.data_ptr() for o in ("rowwise", "colwise") for f in ("data", "scale", "amax")
            if (t := getattr(q, f"{o}_{f}")) is not None}  # fmt: skip


def on_device(kw: dict) -> dict:
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_out_equals_a_fresh_call_and_the_golden(name, given, copies):
    """quantize(x_i, cfg, out=q) for new inputs x_i (new SR seeds, amaxes, delayed-state steps): q itself comes back,
    its memory unchanged, its bytes those of the golden and of a fresh planned call of x_i (whose storage is its own);
    the fp8_delayed state's H[0] is recorded as the golden records it."""
    import native

    cfg = CONFIGS[name]
    if given and name not in GIVEN:
        pytest.skip("no given amax for this config (reference.spec.check_given_amax)")
    if not copies_allowed(cfg, copies):
        pytest.skip("row-scaled 4over6 has no columnwise copy")
    rw, cw = COPIES[copies]
    dtype = torch.bfloat16
    delayed = cfg.scheme == "fp8_delayed"
    for shape in shapes_of(cfg):
        native.clear_plans()
        xs = [make_x(shape, dtype, seed=seed_of(name, shape, dtype) + i) * (i + 1) for i in range(4)]
        gold_state = AmaxHistory(cfg) if delayed else None
        state = AmaxHistory(cfg, device="cuda") if delayed else None
        kws = [call_kwargs(cfg, x, given=given, rng=SRSeed(SEED.seed + i, SEED.stream)) for i, x in enumerate(xs)]
        native.quantize(xs[0].cuda(), cfg, rowwise=rw, colwise=cw, state=copy.deepcopy(state), **on_device(kws[0]))
        q = before = None
        for i, (x, kw) in enumerate(zip(xs, kws, strict=True)):
            gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, state=gold_state, **kw)
            label = f"{name} {shape} {copies} given={given} out= call {i}"
            if q is None:  # the first planned call of the signature: its outputs are a plan's
                q = native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, state=state, **on_device(kw))
                before = pointers(q)
            else:  # a fresh planned call (a copy of the state: the same scale), then the same call into q
                fresh = native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, state=copy.deepcopy(state),
                                        **on_device(kw))  # fmt: skip
                assert native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, state=state, out=q, **on_device(kw)) is q
                assert pointers(q) == before, label
                assert_same(gold, fresh, label + " (fresh)")
                assert not (storages(fresh) & storages(q)), label
            assert_same(gold, q, label)
            if delayed:  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) on every call, out= included
                assert torch.equal(state.history.cpu().view(torch.int32), gold_state.history.view(torch.int32)), label
                gold_state.update()
                native.update_amax_history(state)
        assert len(plans().QUANTIZE_PLANS) == 1


def test_out_refuses_a_tensor_of_another_signature_or_no_plan():
    import native

    cfg = CONFIGS["mxfp8"]
    x = make_x((256, 256), torch.bfloat16, seed=19).cuda()
    first = native.quantize(x, cfg, rowwise=True, colwise=True)  # the full path: no plan allocated it
    with pytest.raises(ValueError, match="no call plan allocated"):
        native.quantize(x, cfg, rowwise=True, colwise=True, out=first)
    q = native.quantize(x, cfg, rowwise=True, colwise=True)
    refused = [
        (dict(x=x[:128]), r"x\.shape is torch.Size\(\[128, 256\]\) here"),
        (dict(colwise=False), "colwise is False here, True for out"),
        (dict(config=CONFIGS["mxfp8-e5m2"]), "config is"),
        (dict(x=x.float()), r"x\.dtype is torch.float32 here"),
    ]
    for kw, message in refused:
        call = dict(x=x, config=cfg, colwise=True) | kw
        with pytest.raises(ValueError, match=message):
            native.quantize(call["x"], call["config"], rowwise=True, colwise=call["colwise"], out=q)
    with pytest.raises(ValueError, match="no call plan allocated"):
        native.quantize(x, cfg, rowwise=True, colwise=True, out=copy.deepcopy(q))
    assert_same(reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True), q, "out= after refused calls: untouched")


# ---- GEMM -----------------------------------------------------------------------------------------------------

GEMMS = {
    "fp8_current": (QuantConfig("fp8_current"), QuantConfig("fp8_current"), ("TN", "NN", "NT")),
    "mxfp8": (QuantConfig("mxfp8"), QuantConfig("mxfp8"), ("TN", "NN", "NT")),
    "fp8_block": (QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128)), ("TN",)),
    "nvfp4": (QuantConfig("nvfp4"), QuantConfig("nvfp4"), ("TN",)),
    "nvfp4-row_scaled": (QuantConfig("nvfp4", variant="row_scaled"), QuantConfig("nvfp4"), ("TN",)),
}


def operands(a_cfg, b_cfg, layout, seed):
    import native

    m, n, k = 256, 128, 256
    a_shape = (m, k) if layout != "NT" else (k, m)
    b_shape = (n, k) if layout == "TN" else (k, n)
    a = native.quantize(make_x(a_shape, torch.bfloat16, seed=seed).cuda(), a_cfg, rowwise=True,
                        colwise=not a_cfg.variant == "row_scaled_4over6")  # fmt: skip
    b = native.quantize(make_x(b_shape, torch.bfloat16, seed=seed + 1).cuda(), b_cfg, rowwise=True, colwise=True)
    return a, b, m, n


@pytest.mark.parametrize("method", ["auto", "portable"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "c", "bias+c"])
@pytest.mark.parametrize("name", list(GEMMS))
def test_planned_gemms_equal_the_full_path(name, epilogue, method):
    import native

    a_cfg, b_cfg, layouts_ = GEMMS[name]
    for layout in layouts_:
        sets = [operands(a_cfg, b_cfg, layout, seed=s) for s in (100, 200)]
        m, n = sets[0][2], sets[0][3]
        g = torch.Generator().manual_seed(3)
        bias = torch.randn(n, generator=g).to(torch.bfloat16).cuda() if "bias" in epilogue else None
        c = torch.randn(m, n, generator=g).to(torch.bfloat16).cuda() if "c" in epilogue.split("+") else None
        native.use_plans(False)
        try:
            expected = [native.gemm(a, b, layout=layout, bias=bias, c=c, method=method) for a, b, _, _ in sets]
        except Exception as e:  # a combination the full path refuses: the planned path must refuse it alike
            native.use_plans(True)
            a, b = sets[0][:2]
            again = error_of(lambda a=a, b=b, lay=layout, bi=bias, cc=c: native.gemm(a, b, layout=lay, bias=bi, c=cc,
                                                                                     method=method))  # fmt: skip
            assert again == (type(e), str(e)), f"{name} {layout} {epilogue}"
            continue
        native.use_plans(True)
        native.clear_plans()
        outs = []
        into = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        kw = {"layout": layout, "bias": bias, "c": c, "method": method}
        assert native.gemm(*sets[0][:2], out=into, **kw) is into  # the full path (first call) in place
        assert torch.equal(into.view(torch.int16), expected[0].view(torch.int16)), f"{name} {layout} full path out="
        native.clear_plans()
        for i in range(3):
            for (a, b, _, _), want in zip(sets, expected, strict=True):
                label = f"{name} {layout} {epilogue} {i}"
                kw = {"layout": layout, "bias": bias, "c": c, "method": method}
                out = native.gemm(a, b, **kw)
                assert torch.equal(out.view(torch.int16), want.view(torch.int16)), label
                outs.append(out)
                again = native.gemm(a, b, **kw)  # the same objects: the memo of the last planned call
                assert torch.equal(again.view(torch.int16), want.view(torch.int16)), label + " (memo)"
                into.fill_(float("nan"))
                assert native.gemm(a, b, out=into, **kw) is into  # in place (planned: memo)
                assert torch.equal(into.view(torch.int16), want.view(torch.int16)), label + " (out=)"
                outs.append(again)
        assert len(plans().GEMM_PLANS) == 1
        assert len({o.untyped_storage().data_ptr() for o in outs[-4:]} | {into.untyped_storage().data_ptr()}) == 5
        # The memo never runs a plan on replaced tensors: the same objects with the other set's tensors.
        (a0, b0, _, _), (a1, b1, _, _) = sets
        native.gemm(a0, b0, **kw)
        for q, src in ((a0, a1), (b0, b1)):
            for f in QuantizedTensor.TENSOR_FIELDS:
                setattr(q, f, getattr(src, f))
        out = native.gemm(a0, b0, **kw)
        assert torch.equal(out.view(torch.int16), expected[1].view(torch.int16)), f"{name} {layout} replaced"


def test_bad_gemm_input_after_a_plan_raises_what_the_full_path_raises():
    import native

    cfg = QuantConfig("fp8_current")
    a, b, m, n = operands(cfg, cfg, "TN", seed=300)
    a_row_only = native.quantize(make_x((256, 256), torch.bfloat16, seed=301).cuda(), cfg, rowwise=True)
    bad_calls = {
        "missing copy": lambda: native.gemm(a_row_only, b, layout="NT"),
        "bias shape": lambda: native.gemm(a, b, bias=torch.ones(n + 1, device="cuda")),
        "cpu operand": lambda: native.gemm(a, reference.quantize(torch.randn(128, 256), cfg)),
        "layout": lambda: native.gemm(a, b, layout="TT"),
        "method": lambda: native.gemm(a, b, method="fastest"),
        "out dtype": lambda: native.gemm(a, b, out_dtype=torch.float16),
    }
    native.use_plans(False)
    expected = {what: error_of(call) for what, call in bad_calls.items()}
    native.use_plans(True)
    for _ in range(2):
        native.gemm(a, b)
        native.gemm(a_row_only, b)
    for what, call in bad_calls.items():
        assert error_of(call) == expected[what], what
    # A wrong out= raises ValueError naming what differs, on the full path and the planned one (and the memo).
    native.clear_plans()
    for _ in range(3):
        for bad, match in ((torch.empty(m, n + 1, dtype=torch.bfloat16, device="cuda"), "shape"),
                           (torch.empty(m, n, device="cuda"), "dtype"), (torch.empty(m, n, dtype=torch.bfloat16), "device"),
                           (torch.empty(n, m, dtype=torch.bfloat16, device="cuda").t(), "contiguous")):  # fmt: skip
            with pytest.raises(ValueError, match=f"out= does not fit this GEMM: {match}"):
                native.gemm(a, b, out=bad)
        native.gemm(a, b)


# ---- programmatic launch: the quantize kernel right after the kernels before it --------------------------------


# Kernels that let dependent grids start at once (PTX griddepcontrol.launch_dependents, sm_90), then spin for `spin`
# cycles and only then write: `value` to out[0] (one thread), or src[0:n] into dst (a grid that fits on the GPU at
# once, so every CTA lets dependents start before any writes).
_LATE_WRITE = r"""
extern "C" __global__ void late_write(float* out, float value, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    out[0] = value;
}
extern "C" __global__ void late_copy(unsigned short* dst, const unsigned short* src, long long n, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


@pytest.mark.parametrize("name", ["nvfp4-1x16", "nvfp4-rht-sr", "fp8_current", "fp8_current-e5m2-pow2", "fp8_delayed",
                                  "mxfp8", "fp8_block-1x128", "fp8_block-128x128"])  # fmt: skip
@pytest.mark.parametrize("large", [False, True], ids=["memset", "clear-launch"])
def test_a_planned_call_reads_the_x_a_kernel_writes_after_letting_it_start(name, large, monkeypatch):
    """An own-amax plan (NVFP4, fp8_current) launches its quantize or cast kernel programmatically after its amax
    kernel, and for a large X (per_tensor.CLEAR_LAUNCH_MIN_X_BYTES, here lowered to 0) clears its zeroed slots with
    a programmatic fill_given first, every kernel after it programmatic (fp8_delayed: fill_given, then its cast);
    those kernels read X before they wait, so the call's first launch (the memset or an ordinary amax launch, or
    fill_given, which waits for the grid before it first) must not let them start before X is written. mxfp8's and
    fp8_block's one launch is programmatic and waits before it reads X. Here the kernel before the call lets
    dependents start at once and writes X only after a ~0.5 ms spin, a new X each call: every planned call, fresh
    and out=, equals the golden of the X written (fp8_delayed: from a state whose scale differs each call, and the
    history it records too)."""
    import cupy

    import native
    from native import per_tensor as native_per_tensor
    from native import plan as native_plan

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic launch needs sm_90")
    cfg = CONFIGS[name]
    one_launch = cfg.scheme in ("mxfp8", "fp8_block")
    if large and one_launch:
        pytest.skip(f"{cfg.scheme} zeroes nothing per call: no clearing launch")
    monkeypatch.setattr(native_per_tensor, "CLEAR_LAUNCH_MIN_X_BYTES", 0 if large else 1 << 62)
    native_plan.clear_plans()  # (a plan this process cached at the default threshold would clear by a memset)
    late_copy = cupy.RawKernel(_LATE_WRITE, "late_copy")
    g = torch.Generator(device="cuda").manual_seed(11)
    m, k = 512, 1024
    x = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    rng = SEED if cfg.stochastic else None
    delayed = cfg.scheme == "fp8_delayed"

    def state_on(device, i):
        if not delayed:
            return None
        state = AmaxHistory(cfg, device=device)
        state.scale.fill_(2.0 ** (i - 2))
        return state

    q = None
    with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):  # (the CUDA stream protocol)
        for i in range(5):
            src = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16) * (i + 1)
            state = state_on("cuda", i)
            torch.cuda.synchronize()
            x.fill_(1.0)  # what a call that does not wait would read
            late_copy((64,), (256,), (cupy.asarray(x.view(torch.int16)), cupy.asarray(src.view(torch.int16)),
                                      cupy.int64(m * k), cupy.int64(1_000_000)))  # fmt: skip
            out = native.quantize(x, cfg, rowwise=True, colwise=True, rng=rng, state=state,
                                  **({"out": q} if i == 4 else {}))  # fmt: skip
            if i == 3:
                q = out  # a plan's outputs (the first call of the signature is the full path's): out= on the next
            torch.cuda.synchronize()
            assert torch.equal(x, src)
            gold_state = state_on("cpu", i)
            gold = reference.quantize(src.cpu(), cfg, rowwise=True, colwise=True, rng=rng, state=gold_state)
            assert_same(gold, out, f"{name} call {i}")
            if delayed:  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)), recorded by the cast's last CTA
                assert torch.equal(state.history.cpu(), gold_state.history) and gold_state.history[0] > 0
    (plan,) = native_plan.QUANTIZE_PLANS._plans.values()  # (the launches tested: the plan's clear, as asked)
    assert getattr(plan, "clear_launch", False) == plan.clears == large
    # fill_given, the amax kernel (not fp8_delayed's), the quantize or cast kernel; or after the block's memset the
    # amax kernel, then the quantize or cast kernel (fp8_delayed: its cast alone, the call's first launch).
    small = [False] if delayed else [True] if one_launch else [False, True]
    assert [s.launch.programmatic for s in plan.steps] == ([True] * (1 + len(small)) if large else small)
    native_plan.clear_plans()  # later tests get plans at the default threshold


@pytest.mark.parametrize("kernel", ["per_tensor_cast", "tensor_amax", "nvfp4_amax"])
def test_a_programmatic_kernel_touches_its_slots_only_after_the_grid_before_it(kernel):
    """The kernels a plan launches programmatically after another read X before they wait (X was complete when
    the kernel before them started), but read or write what that kernel writes only after their wait (PTX
    griddepcontrol.wait; fp8_per_tensor.cu, nvfp4.cu). In a plan the race is too narrow to show (the kernel before
    has only its last atomics left when it lets them start), so each kernel is launched here programmatically right
    after one that lets dependents start at once, spins ~0.5 ms, then writes the slot: fp8_current's cast must read
    the amax written then (its codes and sinv are the golden of that amax, a given amax), an amax kernel's atomicMax
    must land after a late clear (the slot holds a stale 2^100 until then; the result is amax(X) exactly)."""
    import cupy
    import numpy as np

    from native import nvfp4 as native_nvfp4
    from native import per_tensor as native_per_tensor
    from native.launch import PreparedLaunch, module_for, raw_stream

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic launch needs sm_90")
    late_write = cupy.RawKernel(_LATE_WRITE, "late_write")
    index = torch.cuda.current_device()
    m, k = 256, 512
    x = make_x((m, k), torch.bfloat16, seed=23).cuda()
    true_amax = x.abs().float().amax()
    slot = torch.full((1,), 2.0**100, device="cuda") if kernel != "per_tensor_cast" else torch.zeros(1, device="cuda")
    late_value = 0.0 if kernel != "per_tensor_cast" else 3.0 * true_amax.item()  # the late clear, or the amax
    cfg = QuantConfig("fp8_current")
    if kernel == "per_tensor_cast":
        scale, sinv = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
        q_row = torch.empty(m, k, dtype=torch.uint8, device="cuda")
        q_col = torch.empty(k, m, dtype=torch.uint8, device="cuda")
        # (vec flags 1: aligned; amax_in = the slot; no delayed accumulation, copy, store, history or counter)
        args = (x, np.int64(m), np.int64(k), 1, 1, 1, slot, scale, sinv, *[None] * 6, q_row, q_col)
        launch = PreparedLaunch(module_for(native_per_tensor.CU_FILE, cfg, index), "per_tensor_cast_bf16",
                                native_per_tensor.n_tiles(m, k), native_per_tensor.THREADS, args, index,
                                programmatic=True)  # fmt: skip
    elif kernel == "tensor_amax":
        launch = PreparedLaunch(module_for(native_per_tensor.CU_FILE, cfg, index), "tensor_amax_bf16", 64,
                                native_per_tensor.THREADS, (x, np.int64(m * k), 1, slot), index, programmatic=True)
    else:
        bits = slot.view(torch.int32)
        launch = PreparedLaunch(module_for(native_nvfp4.CU_FILE, QuantConfig("nvfp4"), index), "nvfp4_amax_bf16", 64,
                                native_nvfp4.THREADS, (x, np.int64(m), np.int64(k), bits, None), index,
                                programmatic=True)  # fmt: skip
    torch.cuda.synchronize()
    with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):  # (the CUDA stream protocol)
        late_write((1,), (32,), (cupy.asarray(slot), cupy.float32(late_value), cupy.int64(1_000_000)))
        launch([], raw_stream(index))
    torch.cuda.synchronize()
    if kernel == "per_tensor_cast":  # NUMERICS: §1 - the codes and sinv of the amax written late
        gold = reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True, amax=torch.tensor([late_value]))
        assert torch.equal(q_row.cpu(), gold.rowwise_data) and torch.equal(q_col.cpu(), gold.colwise_data)
        assert torch.equal(sinv.cpu(), gold.rowwise_scale.reshape(1).float())
    else:  # NUMERICS: §0.1 - amax(X) exactly, accumulated into the slot after its late clear
        assert slot.item() == true_amax.item()


@pytest.mark.parametrize("name", ["nvfp4-1x16", "nvfp4-sr"])
def test_a_planned_nvfp4_call_reads_the_given_amax_a_kernel_just_wrote(name):
    """A planned given-amax call's first launch (fill_given) is programmatic: it may start as soon as the kernel
    before it lets dependents start, so it must wait for that grid before it reads the given amax. Here the kernel
    before the call lets them start at once, spins ~0.5 ms, then writes the amax (each call's differs from the last,
    and a stale one gives other bits): every planned call, fresh and out=, equals the golden of the amax written."""
    import cupy

    import native

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic launch needs sm_90")
    cfg = CONFIGS[name]
    late_write = cupy.RawKernel(_LATE_WRITE, "late_write")
    g = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(1024, 2048, device="cuda", generator=g, dtype=torch.bfloat16)
    amax = torch.empty(1, device="cuda")
    true_amax = x.abs().float().amax().item()
    rng = SEED if cfg.stochastic else None
    q, prev = None, None
    with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):  # (the CUDA stream protocol)
        for i, factor in enumerate((1.5, 2.0, 3.0, 5.0, 8.0)):
            torch.cuda.synchronize()
            amax.fill_(true_amax * 64)  # what a call that does not wait would read
            late_write((1,), (1,), (cupy.asarray(amax), cupy.float32(true_amax * factor), cupy.int64(1_000_000)))
            out = native.quantize(x, cfg, rowwise=True, colwise=True, rng=rng, amax=amax,
                                  **({"out": q} if i == 4 else {}))  # fmt: skip
            if i == 3:
                q = out  # a plan's outputs (the first call of the signature is the full path's): out= on the next
            gold = reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True, rng=rng,
                                      amax=torch.tensor([true_amax * factor], dtype=torch.float32))  # fmt: skip
            assert_same(gold, out, f"{name} call {i} (amax x {factor})")
            if prev is not None:  # else the test could not tell a stale amax
                assert not torch.equal(gold.rowwise_scale, prev), f"{name} call {i}: the scales of the call before"
            prev = gold.rowwise_scale


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("name", ["nvfp4-1x16", "nvfp4-rht-sr"])
def test_a_planned_nvfp4_call_reads_the_x_a_kernel_just_wrote(name, given):
    """The planned NVFP4 quantize kernel is launched programmatically (native/launch.py): it may start while the
    amax or fill_given kernel before it runs, and copies its first tile before it waits. X comes from a matmul
    enqueued just before each call (still running when the call is enqueued) and each call's X differs from the
    last: every planned call, fresh and out=, equals the golden of the X that matmul wrote."""
    import native

    cfg = CONFIGS[name]
    if given and cfg.rht:
        pytest.skip("a given amax does not apply with RHT")
    m = k = 2048
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(4096, k, device="cuda", generator=g, dtype=torch.bfloat16) / 64
    rng = SEED if cfg.stochastic else None
    q = None
    for i in range(4):
        torch.cuda.synchronize()
        x = (a * (i + 1)) @ b  # X written by the kernel right before the call's first launch
        amax = x.abs().float().amax().reshape(1) * 1.5 if given else None  # (its own kernels: then the matmul's X)
        x = x @ torch.eye(k, device="cuda", dtype=torch.bfloat16) if given else x  # a matmul last, as without
        kw = {"rng": rng} | ({"amax": amax} if given else {})
        out = native.quantize(x, cfg, rowwise=True, colwise=True, **kw, **({"out": q} if i == 3 else {}))
        if i == 2:
            q = out  # a plan's outputs (the first call of the signature is the full path's): out= on the next call
        gold = reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True,
                                  **{kk: (v.cpu() if isinstance(v, torch.Tensor) else v) for kk, v in kw.items()})
        assert_same(gold, out, f"{name} given={given} call {i}")
