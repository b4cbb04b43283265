"""DBN: greedy layer-wise pre-training (Algorithm 2), conversion into a meta graph, fine-tuning
through the ordinary trainer (Algorithm 3), ONNX export of the stack and the fine-tuned net."""

from __future__ import annotations

import doctest
import math

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import meta.lv2.dbn
from meta.lv1 import ReferenceExecutor, from_onnx, save_onnx
from meta.lv2 import ArrayDataset, Optimizer, ShuffleSampler, Trainer, mnist, sgd
from meta.lv2.dbn import DBN, dbn_classifier, pretrain_dbn
from meta.lv2.rbm import RBM


def prototype_images(n=400, seed=0, classes=4, shape=(1, 6, 6)):
    """Binary images: one random prototype per class with 5 % of the pixels flipped."""
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(99).random((classes, *shape)) < 0.5
    y = rng.integers(0, classes, n)
    x = protos[y] ^ (rng.random((n, *shape)) < 0.05)
    return ArrayDataset(x.astype(np.float32), y.astype(np.int64))


@pytest.fixture(scope="module")
def data():
    return prototype_images()


@pytest.fixture(scope="module")
def dbn(data):
    return pretrain_dbn(data, (16, 8), epochs=(4, 3), lr=(0.1, 0.05), k=(1, 2), batch_size=20,
                        seed=3)


def test_layers_are_trained_bottom_up_with_their_own_settings(dbn):
    assert dbn.layers == [36, 16, 8] and dbn.input_shape == (1, 6, 6)
    assert [(r.lr, r.k) for r in dbn.rbms] == [(0.1, 1), (0.05, 2)]
    assert [(m["layer"], m["epoch"]) for m in dbn.history] == \
        [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (2, 3)]
    assert [r.updates for r in dbn.rbms] == [4 * 20, 3 * 20]  # 400 examples in batches of 20
    first = [m["reconstruction_error"] for m in dbn.history if m["layer"] == 1]
    assert first[-1] < first[0]
    assert all(math.isfinite(m["pseudo_log_likelihood"]) for m in dbn.history)
    assert dbn.time_s > 0


def test_upper_layer_learns_from_the_lower_layers_output(data):
    # propagate="mean": layer 2 sees Q(h1=1|x), so it is the RBM one would train on
    # dbn.transform(x, 1) with the same seeds (Generator([seed, 1]), ShuffleSampler(seed + 1)).
    dbn = pretrain_dbn(data, (12, 6), epochs=2, batch_size=40, propagate="mean", seed=5)
    alone = RBM(12, 6, lr=0.1, momentum=0.5, weight_decay=2e-4,
                rng=np.random.default_rng([5, 1]))
    alone.fit(dbn.transform(data.inputs, depth=1), epochs=2, batch_size=40, seed=6)
    np.testing.assert_allclose(dbn.rbms[1].W, alone.W, atol=1e-5)


def test_pretraining_is_reproducible_and_the_seed_matters(data):
    runs = [pretrain_dbn(data, (10, 5), epochs=2, batch_size=50, seed=s) for s in (1, 1, 2)]
    assert all(np.array_equal(a.W, b.W) for a, b in zip(runs[0].rbms, runs[1].rbms))
    assert not np.array_equal(runs[0].rbms[0].W, runs[2].rbms[0].W)
    averaged = pretrain_dbn(data, (10, 5), epochs=2, batch_size=50, seed=1, propagate="mean")
    assert np.array_equal(averaged.rbms[0].W, runs[0].rbms[0].W)  # layer 1 sees the data
    assert not np.array_equal(averaged.rbms[1].W, runs[0].rbms[1].W)


def test_bad_settings_are_refused_by_name(data):
    with pytest.raises(ValueError, match="'epochs' lists 3 values for 2 layers"):
        pretrain_dbn(data, (4, 4), epochs=(1, 1, 1))
    with pytest.raises(ValueError, match="propagate must be one of"):
        pretrain_dbn(data, (4,), propagate="both")
    with pytest.raises(ValueError, match="positive widths"):
        pretrain_dbn(data, ())
    standardised = ArrayDataset(data.inputs - 0.5, data.labels)
    with pytest.raises(ValueError, match="normalize=False"):
        pretrain_dbn(standardised, (4,))


def test_gaussian_first_layer_takes_standardised_input(data):
    x = (data.inputs - data.inputs.mean(0)) / data.inputs.std(0)
    dbn = pretrain_dbn(ArrayDataset(x, data.labels), (12, 6), epochs=3, lr=(0.01, 0.1),
                       batch_size=20, visible="gaussian")
    assert [r.visible for r in dbn.rbms] == ["gaussian", "binary"]
    errors = [m["reconstruction_error"] for m in dbn.history if m["layer"] == 1]
    assert errors[-1] < errors[0]
    assert math.isnan(dbn.history[0]["pseudo_log_likelihood"])


# -- conversion ----------------------------------------------------------------------------

def test_graph_hidden_activations_equal_the_rbm_stacks_propagation(dbn, data):
    x = data.inputs[:50]
    graph = dbn.to_graph(classes=4, seed=0)
    assert [t.name for t in graph.inputs] == ["input", "labels"]
    assert [t.name for t in graph.outputs] == ["logits", "loss"]
    values = ReferenceExecutor(graph).inference({"input": x}, ["hidden1", "hidden2", "logits"])
    # By hand, from the RBMs' own parameters: mu_l = sigmoid(c_l + W_l mu_{l-1}).
    mu = x.reshape(50, -1)
    for layer, rbm in enumerate(dbn.rbms, start=1):
        mu = 1 / (1 + np.exp(-(mu @ rbm.W.T + rbm.c)))
        np.testing.assert_allclose(values[f"hidden{layer}"], mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["hidden2"], dbn.transform(x), rtol=1e-6, atol=1e-7)
    stack = dbn.stack_graph()
    top = ReferenceExecutor(stack).inference({"input": x})[dbn.output_name]
    np.testing.assert_allclose(top, dbn.transform(x), rtol=1e-6, atol=1e-7)
    assert values["logits"].shape == (50, 4)


def test_the_graph_copies_the_weights_and_adds_a_seeded_output_layer(dbn):
    a, b, c = dbn.to_graph(4, seed=0), dbn.to_graph(4, seed=0), dbn.to_graph(4, seed=1)
    assert np.array_equal(a.initializers["fc2.weight"], b.initializers["fc2.weight"])
    assert not np.array_equal(a.initializers["fc2.weight"], c.initializers["fc2.weight"])
    assert a.initializers["fc2.weight"].shape == (4, 8)
    assert not np.shares_memory(a.initializers["fc0.weight"], dbn.rbms[0].W)
    assert a.initializers["fc0.weight"].shape == dbn.rbms[0].W.shape  # (hidden, visible)


def test_fine_tuning_through_the_trainer_classifies(data):
    graph, dbn = dbn_classifier(data, (16, 8), classes=4, seed=0, epochs=3, batch_size=20)
    trainer = Trainer(ReferenceExecutor(graph), Optimizer(sgd(0.1, 0.9), graph.parameters),
                      data, ShuffleSampler(len(data), 20, seed=0), prototype_images(200, seed=1))
    history = trainer.fit(5)
    assert history[-1]["test_accuracy"] > 0.95
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    # Fine-tuning moved the graph's copy, not the pre-trained RBMs.
    assert not np.array_equal(graph.initializers["fc0.weight"], dbn.rbms[0].W)


# -- ONNX -----------------------------------------------------------------------------------

def test_stack_and_fine_tuned_net_export_to_checked_onnx(dbn, data, tmp_path):
    x = data.inputs[:64]
    stack = save_onnx(dbn.stack_graph(), tmp_path / "stack.onnx")
    model = onnx.load(str(stack))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Flatten", "Gemm", "Sigmoid", "Gemm",
                                                     "Sigmoid"]
    theirs = ReferenceEvaluator(model).run(None, {"input": x})[0]
    ours = ReferenceExecutor(from_onnx(stack)).inference({"input": x})[dbn.output_name]
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, dbn.transform(x), rtol=1e-6, atol=1e-7)

    graph = dbn.to_graph(classes=4, seed=0)
    Trainer(ReferenceExecutor(graph), Optimizer(sgd(0.1, 0.9), graph.parameters), data,
            ShuffleSampler(len(data), 20, seed=0)).fit(1)
    net = save_onnx(graph, tmp_path / "dbn.onnx", outputs=["logits"])
    model = onnx.load(str(net))
    onnx.checker.check_model(model, full_check=True)
    theirs = ReferenceEvaluator(model).run(None, {"input": x})[0]
    ours = ReferenceExecutor(graph).inference({"input": x}, ["logits"])["logits"]
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)
    assert np.array_equal(theirs.argmax(1), ours.argmax(1))


def test_docstring_examples():
    assert doctest.testmod(meta.lv2.dbn).failed == 0


# -- does pre-training help? ----------------------------------------------------------------

@pytest.mark.slow
def test_pretraining_lowers_the_fine_tuning_loss_on_mnist(mnist_dir):
    """784-256-256-10, one fine-tuning epoch (79 steps of 64, SGD 0.1 + momentum 0.9) on the
    first 5,000 MNIST images, from the DBN (6 epochs of CD-1 on the same images) or from two
    random initialisations of the same architecture. Measured (2 loaded cores, 1 thread):
    held-out loss 0.43 pre-trained, 0.55 Glorot-uniform x4 (for sigmoid), 2.29 N(0, 0.01) (the
    untrained RBMs' weights); train loss over the epoch 0.58, 1.09, 2.41."""
    train, test = mnist("train", normalize=False), mnist("test", normalize=False)
    subset = ArrayDataset(*train.batch(np.arange(5000)))
    held_out = ArrayDataset(*test.batch(np.arange(2000)))

    def fine_tune(graph):
        trainer = Trainer(ReferenceExecutor(graph), Optimizer(sgd(0.1, 0.9), graph.parameters),
                          subset, ShuffleSampler(len(subset), 64, seed=0), held_out)
        return trainer.fit(1)[-1]

    pretrained = fine_tune(pretrain_dbn(subset, (256, 256), epochs=6, seed=0).to_graph(seed=0))
    untrained = pretrain_dbn(subset, (256, 256), epochs=0, seed=0)
    small = fine_tune(untrained.to_graph(seed=0))
    glorot = untrained.to_graph(seed=0)
    rng = np.random.default_rng(0)
    for i, (fan_in, fan_out) in enumerate(zip(untrained.layers, untrained.layers[1:])):
        bound = 4 * math.sqrt(6 / (fan_in + fan_out))  # Glorot & Bengio's range for sigmoid
        glorot.initializers[f"fc{i}.weight"][...] = rng.uniform(-bound, bound,
                                                                (fan_out, fan_in))
    glorot = fine_tune(glorot)
    assert pretrained["test_loss"] < 0.9 * glorot["test_loss"]
    assert pretrained["test_loss"] < 0.5 * small["test_loss"]
    assert pretrained["train_loss"] < 0.75 * glorot["train_loss"]
    assert pretrained["test_accuracy"] > max(glorot["test_accuracy"], small["test_accuracy"])


def test_layers_and_output_name_of_a_one_layer_dbn():
    rbm = RBM(5, 3)
    assert DBN([rbm], (5,)).layers == [5, 3] and DBN([rbm], (5,)).output_name == "hidden1"
