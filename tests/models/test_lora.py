"""One LoRA adapter per agent: routing, base weights, gradient isolation and requires_grad flags."""

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.models import LoraSpec, adapter_names, attach_adapters, load_model, use_adapter

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
IDS = torch.tensor([[1, 4093, 198, 6004, 28, 2, 198, 1, 520, 9531, 198]])


def _perturb(model, name, seed):
    """Give adapter ``name`` non-zero B matrices (fresh LoRA adapters equal the base model)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if f"lora_B.{name}." in param_name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _lora_flags(model):
    return {n: p.requires_grad for n, p in model.named_parameters()}


@pytest.fixture
def two_adapters(tiny_dir):
    torch.manual_seed(0)
    model = load_model(tiny_dir, lora=SPEC, adapter_names=("alice", "bob"))
    _perturb(model, "alice", 1)
    _perturb(model, "bob", 2)
    return model


def test_attach_makes_every_adapter_trainable_and_the_base_frozen(tiny_dir):
    model = load_model(tiny_dir, lora=SPEC, adapter_names=("alice", "bob"))
    assert adapter_names(model) == ("alice", "bob")
    flags = _lora_flags(model)
    assert any(".alice." in n for n in flags) and any(".bob." in n for n in flags)
    for name, trainable in flags.items():
        assert trainable == ("lora_" in name), name


def test_fresh_adapters_equal_the_base_model(tiny_dir):
    model = load_model(tiny_dir, lora=SPEC, adapter_names=("alice",))
    with use_adapter(model, "alice"):
        adapted = _logits(model)
    with use_adapter(model, None):
        base = _logits(model)
    assert torch.equal(adapted, base)


def _merged_reference(tiny_dir, peft_model, name):
    """A plain model whose weights are W + scaling * B @ A of adapter ``name``, computed by hand."""
    reference = load_model(tiny_dir)
    plain = dict(reference.named_modules())
    with torch.no_grad():
        for module_name, module in peft_model.named_modules():
            if hasattr(module, "lora_A") and name in module.lora_A:
                delta = module.lora_B[name].weight @ module.lora_A[name].weight * module.scaling[name]
                target = plain[module_name.removeprefix("base_model.model.")]
                target.weight.copy_(module.base_layer.weight + delta)
    return reference


def test_each_adapter_computes_its_own_weights_and_none_the_base(tiny_dir, two_adapters):
    base = _logits(load_model(tiny_dir))
    outputs = {}
    for name in ("alice", "bob", None):
        with use_adapter(two_adapters, name):
            outputs[name] = _logits(two_adapters)
    torch.testing.assert_close(outputs[None], base, rtol=0, atol=1e-5)
    for name in ("alice", "bob"):
        expected = _logits(_merged_reference(tiny_dir, two_adapters, name))
        torch.testing.assert_close(outputs[name], expected, rtol=0, atol=1e-4)
    assert (outputs["alice"] - outputs["bob"]).abs().max() > 1e-2


def test_switching_never_changes_requires_grad(two_adapters):
    before = _lora_flags(two_adapters)
    for name in ("bob", None, "alice", None, "bob"):
        with use_adapter(two_adapters, name):
            assert _lora_flags(two_adapters) == before
        assert _lora_flags(two_adapters) == before


def test_backward_under_an_adapter_reaches_only_that_adapter(two_adapters):
    with use_adapter(two_adapters, "bob"):
        two_adapters(input_ids=IDS).logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in two_adapters.named_parameters() if "lora_" in n}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if ".bob." in n)
    assert all(g is None for n, g in grads.items() if ".alice." in n)
    assert all(p.grad is None for n, p in two_adapters.named_parameters() if "lora_" not in n)


def test_use_adapter_nests_and_restores_the_previous_routing(two_adapters):
    with use_adapter(two_adapters, "alice"):
        alice = _logits(two_adapters)
    with use_adapter(two_adapters, None):
        base = _logits(two_adapters)
        with use_adapter(two_adapters, "alice"):
            assert torch.equal(_logits(two_adapters), alice)
        assert torch.equal(_logits(two_adapters), base)
    with use_adapter(two_adapters, "alice"):
        with use_adapter(two_adapters, None):
            assert torch.equal(_logits(two_adapters), base)
        assert torch.equal(_logits(two_adapters), alice)


def test_adapter_errors_name_the_problem(tiny_dir, two_adapters):
    with pytest.raises(ConfigError, match="unknown LoRA adapter 'carol'"):
        with use_adapter(two_adapters, "carol"):
            pass
    plain = load_model(tiny_dir)
    with use_adapter(plain, None) as same:
        assert same is plain
    with pytest.raises(ConfigError, match="no LoRA adapters"):
        with use_adapter(plain, "alice"):
            pass
    with pytest.raises(ConfigError, match="already exist"):
        attach_adapters(two_adapters, ["alice"], SPEC)
    for bad in ([], ["a", "a"], ["has.dot"], ["my_lora_x"]):
        with pytest.raises(ConfigError):
            attach_adapters(load_model(tiny_dir), bad, SPEC)


def test_load_model_arguments_are_checked(tiny_dir):
    with pytest.raises(ConfigError, match="without a LoRA spec"):
        load_model(tiny_dir, adapter_names=("alice",))
    with pytest.raises(ConfigError, match="at least one adapter"):
        load_model(tiny_dir, lora=SPEC)
    with pytest.raises(ConfigError, match="unsupported dtype"):
        load_model(tiny_dir, dtype="float16")
    with pytest.raises(ConfigError):
        LoraSpec(rank=0)


def test_bfloat16_load(tiny_dir):
    model = load_model(tiny_dir, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "peft-mixed-batch"])
def test_per_row_adapters_give_each_row_its_own_adapter_in_one_forward(two_adapters, packed, monkeypatch):
    from pettingllms.models import lora_rows

    if not packed:  # the path for layers the packing does not cover: peft's adapter_names
        monkeypatch.setattr(lora_rows, "_packed_columns", lambda layers, adapters: None)
    rows = torch.cat([IDS, IDS.flip(1), IDS, IDS.flip(1)])
    names = ["alice", None, "bob", "alice"]
    alone = []
    for row, name in enumerate(names):
        with use_adapter(two_adapters, name):
            alone.append(_logits(two_adapters, rows[row : row + 1]))
    assert not torch.equal(alone[0], alone[2])  # the adapters differ: routing a row wrongly would show
    two_adapters.eval()  # inference only, as peft's mixed-batch forward
    with lora_rows.per_row_adapters(two_adapters, names) as router:
        assert router.packed is packed
        kwargs = router.forward_kwargs(names)
        assert kwargs == ({} if packed else {"adapter_names": ["alice", "__base__", "bob", "alice"]})
        with torch.no_grad():
            mixed = two_adapters(input_ids=rows, **kwargs).logits
        torch.testing.assert_close(mixed, torch.cat(alone), rtol=0, atol=1e-5)
        kwargs = router.forward_kwargs(names[2:])  # rows leave the batch between decode steps
        with torch.no_grad():
            fewer = two_adapters(input_ids=rows[2:], **kwargs).logits
        torch.testing.assert_close(fewer, torch.cat(alone[2:]), rtol=0, atol=1e-5)
    assert all("forward" not in vars(m) for m in two_adapters.modules())  # the layers' own forward is back
    with lora_rows.per_row_adapters(two_adapters, ["bob", "bob"]) as router:  # one adapter: plain routing
        assert router is None
        assert torch.equal(_logits(two_adapters), alone[2])  # rows[2] is IDS, under bob
    with pytest.raises(ConfigError, match="carol"):
        with lora_rows.per_row_adapters(two_adapters, ["alice", "carol"]):
            pass
    two_adapters.train()
    with pytest.raises(ConfigError, match="inference"):
        with lora_rows.per_row_adapters(two_adapters, ["alice", "bob"]):
            pass


def test_what_the_packing_does_not_cover_goes_through_peft(two_adapters):
    from peft.tuners.lora import LoraLayer

    from pettingllms.models.lora_rows import RowRouter

    assert RowRouter(two_adapters, ["alice", "bob"]).packed
    layer = next(m for m in two_adapters.modules() if isinstance(m, LoraLayer))
    layer.lora_bias["bob"] = True  # a LoRA bias on B: not in the packed product
    assert not RowRouter(two_adapters, ["alice", "bob"]).packed
    layer.lora_bias["bob"] = False
    layer.r["bob"] += 1  # one layer's rank differs from the others'
    assert not RowRouter(two_adapters, ["alice", "bob"]).packed
