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
# # A model folder, its card and config, and the paper's figures
#
# What a trained model folder holds, how to read it, and how to draw the paper's Figs. 1, 4 and 5
# from a run: first from a run made here in seconds, then from the committed run files of the
# measured CIFAR-10 budget. The second part reads `results/` of a source checkout of the
# repository (`pip install -e .`), so run this tutorial from one.
#
# Everything is written under a fresh temporary folder, printed below.

# %%
import json
import tempfile
from pathlib import Path

import yaml

import hscl_zoo
from hscl_zoo.cli import main as hscl_zoo_cli
from hscl_zoo.reproduction.figures import plot_histories, plot_run_dirs
from hscl_zoo.reproduction.summary import by_method, display

work = Path(tempfile.mkdtemp(prefix="hscl-zoo-tutorial-"))
print("working in", work)

# %% [markdown]
# ## A model folder
#
# Every finished pretraining run writes one, under `<output_dir>/hub/`, in the layout of a Hugging
# Face model repository. A short run on the bundled digits (300 images, 2 epochs) makes one here;
# a zoo name or `hf-hub:owner/repo` gives the same files once weights are published.

# %%
run_dir = work / "runs" / "digits"
status = hscl_zoo_cli(["train", "--dataset", "digits", "--subset", "300", "--method", "hscl-beta",
                       "--backbone", "resnet10t", "--epochs", "2", "--batch_size", "64",
                       "--probe_epochs", "10", "--knn_k", "5", "--output_dir", str(run_dir)])
assert status == 0, f"hscl-zoo train exited with status {status}"
hub = run_dir / "hub"
for path in sorted(hub.iterdir()):
    print(f"{path.name:<20} {path.stat().st_size:>10,} bytes")

# %% [markdown]
# * `model.safetensors`: the weights (backbone, projection head, linear head), loaded strictly;
# * `config.json`: how to rebuild the model (architecture), how to preprocess an image
#   (`pretrained_cfg`), the class names and how it was trained (`training`);
# * `README.md`: the model card, rendered from the config and the evaluation;
# * `metrics.json`: the final evaluation and the per-epoch history the figures are drawn from.
#
# ## The config
#
# `config.json` is plain JSON; `hscl_zoo.load` reads it to rebuild the model before loading the
# weights, and exposes the same facts on the model.

# %%
config = json.loads((hub / "config.json").read_text())
print(sorted(config))
preprocessing = config["pretrained_cfg"]
print("preprocessing:", {key: preprocessing[key]
                         for key in ("input_size", "mean", "std", "interpolation")})
training = config["training"]
print("training:", {key: training[key] for key in ("dataset", "method", "hyperparameters", "epochs",
                                                    "global_batch_size")})
print("negatives per anchor (expected from the batch size):",
      training["expected_negatives_per_anchor"])

model = hscl_zoo.load(f"local-dir:{hub}")
print(type(model).__name__, "with classes", model.class_names)
assert model.pretrained_cfg["input_size"] == preprocessing["input_size"]
assert model.training_summary["method"] == "hscl-beta"

# %% [markdown]
# ## The card
#
# `README.md` is what the Hub shows on the model's page: YAML front matter (library, tags,
# datasets, metrics and, once there are results, the `model-index` the Hub's leaderboards read),
# then sections on loading, preprocessing, training, results and limitations. `datasets` names a
# Hub dataset repo, so this card of a digits run (data bundled with scikit-learn, on no Hub repo)
# has none. The zoo's own cards live in `model_cards/` and come from the same template.

# %%
card = (hub / "README.md").read_text()
_, front, body = card.split("---\n", 2)
metadata = yaml.safe_load(front)
print({key: metadata.get(key) for key in ("library_name", "tags", "datasets")})
for result in metadata["model-index"][0]["results"]:
    print(result["dataset"]["name"], [(m["type"], m["value"]) for m in result["metrics"]])
print([line for line in body.splitlines() if line.startswith("## ")])

# %% [markdown]
# ## The figures of this run
#
# `plot_run_dirs` (what `python recipes/plot.py RUN ... --out DIR` runs) reads each run's
# `metrics.jsonl`, one record per epoch, and draws Fig. 1 (kNN accuracy against epoch), Fig. 4
# (the fraction of anchors for which Assumption 1 holds) and Fig. 5 (the four losses of Lemma 1).
# Pass several runs to compare them on the same axes.

# %%
figures = plot_run_dirs([run_dir], work / "figures-digits")
print([path.name for path in figures])

# %% [markdown]
# ## The paper's figures from the committed runs
#
# `results/cpu-cifar10-10k/runs/` holds one JSON file per method and seed of the CIFAR-10 budget
# measured on a CPU ([Results and studies](../../results/)): the final accuracies, the commit that
# produced them and the per-epoch `history`. `plot_histories` takes (label, history) pairs; the
# first seed of each method, labelled with the paper's method names, is what
# `recipes/reproduce.py` draws into `results/cpu-cifar10-10k/figures/`.

# %%
results = Path(hscl_zoo.__file__).resolve().parents[1] / "results" / "cpu-cifar10-10k"
if not (results / "runs").is_dir():
    raise SystemExit(f"{results / 'runs'} is missing: run this tutorial from a source checkout "
                     "of hscl_zoo (git clone, then pip install -e .).")
records = [json.loads(path.read_text()) for path in sorted((results / "runs").glob("*.json"))]
first_seed = {method: runs[0] for method, runs in by_method(records).items()}
for method, record in first_seed.items():
    print(f"{display(method):<12} seed {record['seed']}: {len(record['history'])} epochs, "
          f"linear-probe top-1 {record['top1']:.2f}%")
series = [(f"{display(method)} (seed {record['seed']})", record["history"])
          for method, record in first_seed.items()]
paper_figures = plot_histories(series, work / "figures-cifar10")
print([path.name for path in paper_figures])
assert all(path.stat().st_size > 0 for path in [*figures, *paper_figures])
