"""meta's bf16 training against PyTorch's autocast bf16 (issue 42's acceptance): the same MLP
(PyTorch's initial weights copied into meta's graph), the same data in the same order, SGD
with momentum in both; 200 steps of ``PlannedExecutor(precision="bf16")`` with meta's
optimizer and of PyTorch under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the losses at
steps 0, 20, ..., 200 agree within 0.02.

Why the comparison means something: the same two trainers in float32 agree closer (a bound four
times tighter; measured 1e-3 at worst, late, where the loss falls fastest and a difference in
the last bit grows; bf16 against autocast 2.4e-3), meta's bf16 losses differ from its float32
ones (the bf16 products are in use, not a float32 run under a bf16 name) and the plan places
every matrix product in bf16. The data is learnable but noisy (labels of a random linear
teacher with noise on its scores, a fresh batch every step), so the loss falls from 2.3 to
about 1.5 without reaching the near-zero, batch-to-batch jittery losses of memorised data,
where any rounding, float32's too, moves a step's loss by more than the bound.
"""

from __future__ import annotations

import numpy as np
import pytest

from meta import lv1, lv2
from meta.lv1.plan.precision import native_bf16

torch = pytest.importorskip("torch")
F = torch.nn.functional

HIDDEN = (256, 128)
FEATURES, CLASSES = 256, 10
BATCH, STEPS, EVERY = 64, 200, 20
LR, MOMENTUM = 0.02, 0.9
TEACHER_NOISE = 10.0  # std of the noise on the teacher's scores (theirs: about 16)
BOUND = 0.02  # the acceptance bound, nats, at every EVERY-th step
F32_BOUND = BOUND / 4  # the same trainers in float32


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    """A fresh batch for each of the STEPS + 1 losses (the last measured without a step)."""
    rng = np.random.default_rng(0)
    n = (STEPS + 1) * BATCH
    x = rng.standard_normal((n, 1, 16, 16), dtype=np.float32)
    teacher = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    scores = x.reshape(n, -1) @ teacher + TEACHER_NOISE * rng.standard_normal((n, CLASSES))
    return x, np.argmax(scores, 1).astype(np.int64)


def batch(data, step: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = data
    return x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]


def torch_losses(data, autocast: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """PyTorch's initial weights (meta's parameter names) and its losses at every step."""
    torch.manual_seed(0)
    layers, width = [torch.nn.Flatten()], FEATURES
    for h in HIDDEN:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, CLASSES))
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    initial = {f"fc{i}.{kind}": getattr(m, kind).detach().numpy().copy()
               for i, m in enumerate(linears) for kind in ("weight", "bias")}
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS + 1):
        x, y = (torch.from_numpy(a) for a in batch(data, step))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(net(x), y)
        losses.append(loss.item())
        if step < STEPS:
            loss.backward()
            optimizer.step()
    return initial, np.array(losses)


def meta_losses(data, initial: dict[str, np.ndarray],
                precision: str) -> tuple[dict[str, str], np.ndarray]:
    """meta's placement and losses: the same MLP with PyTorch's weights, meta's SGD."""
    graph = lv1.mlp((1, 16, 16), HIDDEN, CLASSES, seed=0)
    assert set(graph.parameters) == set(initial)
    for name, value in initial.items():
        graph.parameters[name][...] = value
    executor = lv1.PlannedExecutor(graph, precision=precision).train()
    optimizer = lv2.Optimizer(lv2.sgd(LR, MOMENTUM), graph.parameters)
    losses = []
    for step in range(STEPS + 1):
        x, y = batch(data, step)
        feeds = {"input": x, "labels": y}
        if step < STEPS:
            values, grads = executor.inference_and_backprop(feeds, loss="loss")
            optimizer.step(grads)
        else:
            values = executor.inference(feeds, ["loss"])
        losses.append(float(values["loss"]))
    return executor.placement(), np.array(losses)


@pytest.fixture(scope="module")
def runs(data) -> dict[str, np.ndarray]:
    if not native_bf16()[0]:
        pytest.skip(f"bf16 is not native here ({native_bf16()[1]}): precision=bf16 runs "
                    "float32, nothing to compare")
    initial, torch_f32 = torch_losses(data, autocast=False)
    _, torch_bf16 = torch_losses(data, autocast=True)
    placement, meta_bf16 = meta_losses(data, initial, "bf16")
    _, meta_f32 = meta_losses(data, initial, "f32")
    return {"torch f32": torch_f32, "torch bf16": torch_bf16, "meta f32": meta_f32,
            "meta bf16": meta_bf16, "placement": placement}


def gaps(a: np.ndarray, b: np.ndarray) -> dict[int, float]:
    return {s: abs(float(a[s] - b[s])) for s in range(0, STEPS + 1, EVERY)}


def test_meta_bf16_follows_pytorch_autocast_within_002(runs):
    gap = gaps(runs["meta bf16"], runs["torch bf16"])
    worst = max(gap, key=gap.get)
    assert gap[worst] <= BOUND, (
        f"step {worst}: meta bf16 loss {runs['meta bf16'][worst]:.4f}, PyTorch autocast "
        f"{runs['torch bf16'][worst]:.4f} (every 20th step: {gap})")
    # it trained: the loss fell well below chance's log(10) = 2.30
    assert runs["meta bf16"][-1] < 2.0 and runs["torch bf16"][-1] < 2.0


def test_the_comparison_can_fail(runs):
    """float32 against float32 agrees four times closer; meta's bf16 run is a bf16 run."""
    assert max(gaps(runs["meta f32"], runs["torch f32"]).values()) <= F32_BOUND
    products = {n: w for n, w in runs["placement"].items() if n.startswith(("fc", "logits"))
                and not w.startswith("fused")}
    assert products and all(w == "onednn bf16" for w in products.values()), runs["placement"]
    assert max(gaps(runs["meta bf16"], runs["meta f32"]).values()) > 1e-4
