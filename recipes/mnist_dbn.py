"""MNIST with a 784-500-500-10 deep belief network: greedy layer-wise CD-1 pre-training of two
RBMs (seed 000, Algorithms 1 and 2), then supervised fine-tuning by SGD (Algorithm 3).

Run:  meta run recipes/mnist_dbn.py

NOT YET WIRED: the schema and the runner do not know these keys yet (``meta.recipe`` rejects
them). What they need, all in ``meta.lv2.dbn``:

  new Definitions keys (MUTABLE here)      meaning                       pretrain_dbn argument
  pretrain_epochs: int = 1    (>= 0)        CD epochs per RBM             epochs
  pretrain_lr: float = 0.1    (> 0)         RBM learning rate             lr
  cd_k: int = 1               (>= 1)        Gibbs steps per CD update     k
  pretrain_batch_size: int = 100 (> 0)      RBM minibatch                 batch_size
  persistent_cd: bool = False               PCD instead of CD-k           persistent
  CHOICES["model"] gains "dbn"; "hidden" gives the RBM widths.

The runner, for model "dbn", in build_trainer instead of MODELS[d.model](...):

  train/test = DATASETS[d.dataset](split, normalize=False)   # binary visible units: [0, 1]
  graph, dbn = dbn_classifier(train, d.hidden, classes=10, seed=d.seed,
                              epochs=d.pretrain_epochs, lr=d.pretrain_lr, k=d.cd_k,
                              batch_size=d.pretrain_batch_size, persistent=d.persistent_cd,
                              progress=print_progress(stream) if comm.is_root else None)

then trains ``graph`` like any other; a "pretrain_time_s" metric (dbn.time_s, in METRIC_NAMES)
and ``save_onnx(dbn.stack_graph(), out / "dbn_stack.onnx")`` are optional extras. Under MPI
every rank pre-trains the whole stack from the same seed (identical RBMs, no communication).

Measured without the runner (tests/e2e/test_mnist_dbn.py, 2 loaded cores, one BLAS thread):
pre-training 27 s, fine-tuning 36 s, test accuracy 97.71 %.
"""

from meta.recipe import AtLeast, AtMost

FIXED = {
    "dataset": "mnist",
    "model": "dbn",
    "hidden": [500, 500],
    "optimizer": "sgd",
}

MUTABLE = {
    "pretrain_epochs": 1,
    "pretrain_lr": 0.1,
    "cd_k": 1,
    "pretrain_batch_size": 100,
    "persistent_cd": False,
    "epochs": 4,  # of fine-tuning
    "batch_size": 128,
    "lr": 0.3,  # sigmoid hidden units take a larger step than mnist_mlp's ReLUs
    "momentum": 0.9,
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
    "train_time_s": AtMost(180),
}
