# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # H-SCL(beta) in your own training loop
#
# The pretraining recipe is one way to train with the paper's losses; this tutorial writes the
# loop by hand, so you can drop the loss into code of your own. It trains a small encoder on
# scikit-learn's bundled digits (no download, no GPU) for a few dozen steps with H-SCL(beta),
# watches the paper's Sec. V-B diagnostics while it trains, and checks with a kNN classifier that
# the embeddings learned something. It runs in well under a minute on one CPU core:
# `python docs/tutorials/01_loss_in_your_loop.py`, or open it as a notebook with jupytext.
#
# The pieces are the ones [The losses in your own loop](../../losses-guide/) describes:
# `build_loss` for the objective, `DiagnosticsMeter`, `assumption_fraction` and `lemma_losses`
# for the diagnostics, and the data helpers of [Datasets and your own data](../../data/).

# %%
import math

import torch

import hscl_zoo

torch.manual_seed(0)

# %% [markdown]
# ## Data: two augmented views of every image
#
# `load_splits("digits")` gives train and test tables of 16x16 RGB digits. `MultiViewDataset`
# draws two SimCLR views of each training image; every draw is a function of (seed, epoch,
# index), so a second run sees the same batches. A batch is `(views, labels, index)` with views
# of shape (B, V, 3, H, W).

# %%
data = hscl_zoo.load_splits("digits")
spec = data.spec
augment = hscl_zoo.simclr_transform(spec.image_size, mean=spec.mean, std=spec.std)
views_dataset = hscl_zoo.MultiViewDataset(data.train, augment, views=2, seed=0)
loader = hscl_zoo.make_loader(views_dataset, batch_size=128, seed=0, drop_last=True)
print(f"{len(data.train)} training images, {len(data.class_names)} classes, "
      f"{len(loader)} batches an epoch")

# %% [markdown]
# ## Encoder, loss and optimiser
#
# `create_model` builds a timm backbone with a projection head (what the loss sees, through
# `model.project`) and a linear head. A `resnet10t` with timm's stride-2 stem
# (`small_stem=False`) keeps this tutorial fast; the zoo trains ResNet-18s and ResNet-50s the
# same way. `build_loss("hscl-beta", beta=1.0)` is H-SCL with the exponential tilt: other-label
# images are the negatives, weighted by exp(beta * g), and every same-label view in the batch is
# a positive.

# %%
model = hscl_zoo.create_model("resnet10t", num_classes=len(data.class_names),
                              image_size=spec.image_size, mean=spec.mean, std=spec.std,
                              small_stem=False)
loss_fn = hscl_zoo.build_loss("hscl-beta", beta=1.0)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

# %% [markdown]
# Before training, a kNN classifier on the frozen features gives the baseline to beat.
# `extract_features` encodes a table with the model's own evaluation preprocessing
# (`model.transform`).


# %%
def knn_accuracy(model: hscl_zoo.ContrastiveEncoder) -> float:
    """kNN top-1 (%) of the test digits against the training digits, on the backbone features."""
    model.eval()
    train = hscl_zoo.extract_features(model.encode, data.train, model.transform, progress=False)
    test = hscl_zoo.extract_features(model.encode, data.test, model.transform, progress=False)
    return hscl_zoo.knn_top1(*train, *test, k=20)


knn_before = knn_accuracy(model)
print(f"kNN top-1 before training: {knn_before:.1f}%")

# %% [markdown]
# ## The loop, with the diagnostics
#
# The loss takes features of shape (B, V, d) and labels of shape (B,). A `DiagnosticsMeter` with
# the loss's own beta accumulates, batch by batch and without gradient, what the paper plots in
# its Sec. V-B: the fraction of anchors for which Assumption 1 holds, the four losses of Lemma 1
# (L_UCL, L_SCL, L_HUCL, L_HSCL, all with label positives) and the quantiles of the cosines to
# other-label negatives. `compute()` gives the epoch's record; the recipe writes the same record
# to `metrics.jsonl` every epoch.

# %%
EPOCHS = 2
history = []
for epoch in range(1, EPOCHS + 1):
    model.train()
    loader.set_epoch(epoch)
    meter = hscl_zoo.DiagnosticsMeter(beta=1.0)
    losses = []
    for views, labels, _ in loader:
        batch, n_views = views.shape[:2]
        features = model.project(views.flatten(0, 1)).view(batch, n_views, -1)
        loss = loss_fn(features, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        meter.update(features.detach(), labels)
        losses.append(loss.item())
    record = {"epoch": epoch, "train_loss": sum(losses) / len(losses), **meter.compute()}
    history.append(record)
    hscl, hucl = record["loss_hscl"], record["loss_hucl"]
    print(f"epoch {epoch}: loss {record['train_loss']:.3f}, Assumption 1 holds for "
          f"{100 * record['assumption_fraction']:.1f}% of anchors, "
          f"L_HSCL {hscl:.3f} <= L_HUCL {hucl:.3f}: {hscl <= hucl}, "
          f"median other-label cosine {record['neg_cos_q50']:.2f}")

# %% [markdown]
# ## The diagnostics on one batch
#
# The same quantities are plain functions of a batch. Lemma 1 says L_HSCL <= L_HUCL when
# Assumption 1 holds for every anchor; on a real batch it holds for a fraction of them, and
# `lemma_losses` shows where the two losses stand.

# %%
model.eval()
views, labels, _ = next(iter(loader))
with torch.no_grad():
    features = model.project(views.flatten(0, 1)).view(views.shape[0], views.shape[1], -1)
fraction = hscl_zoo.assumption_fraction(features, labels, beta=1.0)
lemma = hscl_zoo.lemma_losses(features, labels, beta=1.0)
print(f"Assumption 1 holds for {100 * fraction:.1f}% of this batch's anchors")
print({name: round(value, 4) for name, value in lemma.items()})
assert 0.0 <= fraction <= 1.0 and all(math.isfinite(v) for v in lemma.values())

# %% [markdown]
# ## Did it learn?
#
# The kNN classifier on the trained features, against the untrained baseline above. Two epochs
# of a small network on 16-pixel digits is a smoke test, not a result: the
# [results page](../../results/) has the measured comparisons of the five losses.

# %%
knn_after = knn_accuracy(model)
print(f"kNN top-1 after {EPOCHS} epochs: {knn_after:.1f}% (before: {knn_before:.1f}%)")
assert knn_after > knn_before, "training did not improve the kNN accuracy"
