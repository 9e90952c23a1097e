"""Model cards: the checked-in cards are exactly what the registry renders, and cards for trained
models carry their measured results beside the paper's."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from hscl_zoo.configs import config_file
from hscl_zoo.models import create_model
from hscl_zoo.publishing import cards
from hscl_zoo.publishing.cards import registry_card
from hscl_zoo.zoo.cards import render_card
from hscl_zoo.zoo.registry import info, list_models

ROOT = Path(__file__).resolve().parents[1]
CARDS = ROOT / "model_cards"
TRAINING = {
    "dataset": "cifar100", "method": "hscl-beta", "hyperparameters": {"beta": 1.0, "temperature": 0.5, "lr": 0.001},
    "epochs": 200, "global_batch_size": 512, "expected_negatives_per_anchor": 1020,
    "config": "hscl-beta-cifar100",
}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    header, _, _ = card[4:].partition("\n---\n")
    return yaml.safe_load(header)


@pytest.fixture(scope="module")
def trained_config():
    model = create_model("resnet10t", num_classes=100, image_size=32, mean=[0.507, 0.4865, 0.4409],
                         std=[0.2673, 0.2564, 0.2762])
    return {**model.model_config(), "training": TRAINING}


def test_checked_in_cards_equal_regenerated_ones():
    assert sorted(p.stem for p in CARDS.glob("*.md")) == list_models()
    assert cards.check_cards(CARDS) == [], "run: python -m hscl_zoo.publishing.cards --out model_cards"


def test_check_command_reports_stale_missing_and_extra_cards(tmp_path, capsys):
    out = tmp_path / "cards"
    shutil.copytree(CARDS, out)
    assert cards.main(["--out", str(out), "--check"]) == 0
    (out / "scl-cifar10.md").write_text((out / "scl-cifar10.md").read_text() + "edited\n")
    (out / "ucl-stl10.md").unlink()
    (out / "simclr-cifar10.md").write_text("stray")
    assert sorted(cards.check_cards(out)) == sorted([
        f"out of date: {out / 'scl-cifar10.md'}", f"missing: {out / 'ucl-stl10.md'}",
        f"not a zoo name: {out / 'simclr-cifar10.md'}",
    ])
    assert cards.main(["--out", str(out), "--check"]) == 1
    stderr = capsys.readouterr().err
    assert "out of date" in stderr and f"python -m hscl_zoo.publishing.cards --out {out}" in stderr
    assert cards.main(["--out", str(out)]) == 0
    assert cards.check_cards(out) == [f"not a zoo name: {out / 'simclr-cifar10.md'}"]


# The spec the cards must follow, written out here rather than read from the registry they render.
HUB_DATASETS = {"stl10": "tanganke/stl10", "cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100",
                "tinyimagenet": "zh-plus/tiny-imagenet"}
CLASSES = {"stl10": 10, "cifar10": 10, "cifar100": 100, "tinyimagenet": 200}
PIXELS = {"stl10": 96, "cifar10": 32, "cifar100": 32, "tinyimagenet": 64}


IMAGE_NAMES = [n for n in list_models() if info(n).modality == "image"]
GRAPH_NAMES = [n for n in list_models() if info(n).modality == "graph"]


@pytest.mark.parametrize("name", [n for n in IMAGE_NAMES if "." not in n])  # releases: test_committed_releases
def test_checked_in_card_states_its_dataset_config_and_stem(name):
    """Each card against the dataset table of the README and the recipe config it names."""
    method, dataset = next((m, d) for d in HUB_DATASETS for m in ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau")
                           if name == f"{m}-{d}")
    card = (CARDS / f"{name}.md").read_text()
    header = front_matter(card)
    assert header["datasets"] == [HUB_DATASETS[dataset]]
    assert {method, "resnet50"} <= set(header["tags"])
    assert f"# {name}\n" in card and f"`hscl-zoo/{name}`" in card
    assert f"# (1, {CLASSES[dataset]}) class probabilities" in card
    assert f"{CLASSES[dataset]} classes at {PIXELS[dataset]}x{PIXELS[dataset]} pixels" in card
    config = yaml.safe_load(config_file(name).read_text())
    assert f"Config: `{name}` (shipped with the `hscl-zoo` package)" in card
    assert (config["dataset"], config["method"], config["backbone"]) == (dataset, method, "resnet50")
    assert ("uses timm's default ResNet stem" in card) == (config["stem"] == "default")


@pytest.mark.parametrize("name", [n for n in IMAGE_NAMES if not info(n).published])
def test_registry_card_claims_no_results_before_publication(name):
    entry = info(name)
    card = (CARDS / f"{name}.md").read_text()
    header = front_matter(card)
    assert header["library_name"] == "hscl_zoo"
    assert entry.method in header["tags"] and header["metrics"] == ["accuracy"]
    assert len(header["datasets"]) == 1
    assert "model-index" not in header
    assert "Weights not published yet" in card and entry.train_command in card
    assert "| this model | not published yet |" in card
    assert f"{entry.paper_top1:.2f}" in card
    assert f'hscl_zoo.load("{name}")' in card
    for section in ("## How to load", "## Preprocessing", "## Training", "## Results", "## Limitations",
                    "## Citation"):
        assert section in card
    assert "Supervised Contrastive Learning with Hard Negative Samples" in card


def test_card_for_a_trained_model_shows_results_and_recipe(trained_config):
    card = render_card(trained_config, {"top1": 75.3, "top5": 93.21, "knn_top1": 71.5})
    header = front_matter(card)
    (result,) = header["model-index"][0]["results"]
    assert header["model-index"][0]["name"] == "hscl-beta-cifar100"
    assert result["dataset"] == {"name": "CIFAR-100", "type": "uoft-cs/cifar100"}
    assert {"type": "accuracy", "value": 75.3, "name": "Top-1 accuracy (linear probe)"} in result["metrics"]
    assert {"type": "knn_accuracy", "value": 71.5, "name": "Top-1 accuracy (kNN on frozen features)"} in result["metrics"]
    assert "| this model | 75.30 |" in card and "| paper, Table 1 | 75.11 |" in card
    assert "| negatives per anchor (expected from the batch size) | 1020 |" in card and "| `beta` | 1 |" in card
    assert "| mean | 0.5070, 0.4865, 0.4409 |" in card and "| input size | 3 x 32 x 32 |" in card
    assert "reproduce with `hscl-zoo train --config hscl-beta-cifar100`" in card
    assert "Weights not published yet" not in card


def test_card_of_a_run_started_without_a_config_names_none(trained_config):
    """A run trained from arguments is not reproduced by its entry's paper config: the card must not say it is."""
    training = {key: value for key, value in TRAINING.items() if key != "config"}
    card = render_card({**trained_config, "training": training}, {"top1": 75.3})
    assert "--config" not in card and "reproduce with" not in card
    assert "Trained without a shipped config" in card and "| `beta` | 1 |" in card


def test_card_for_a_published_entry_has_model_index():
    entry = dataclasses.replace(info("scl-cifar10"), revision="c" * 40, files={"model.safetensors": ("d" * 64, 1)}, metrics={"top1": 93.1})
    card = render_card(entry)
    assert front_matter(card)["model-index"][0]["results"][0]["metrics"][0]["value"] == 93.1
    assert "revision `" + "c" * 40 in card and "| this model | 93.10 |" in card


def test_card_of_a_release_says_its_budget_and_where_its_files_are():
    entry = dataclasses.replace(info("scl-cifar10"), name="scl-cifar10.cpu-2ep", tag="cpu-2ep", budget="2 CPU epochs",
                                files={"model.safetensors": ("d" * 64, 1)}, metrics={"top1": 31.5})
    card = render_card(entry)
    assert "releases/scl-cifar10.cpu-2ep/" in card and "not on the Hub yet" in card
    assert "Budget: 2 CPU epochs. Not the paper's recipe" in card and "--config scl-cifar10" not in card
    assert "| this model (2 CPU epochs) | 31.50 |" in card and "| paper, Table 1 |" in card


def test_card_name_and_repo_override(trained_config):
    card = render_card(trained_config, {"top1": 70.0}, name="my-run", repo_id="me/my-run")
    body = card[4:].partition("\n---\n")[2]
    assert body.lstrip("\n").splitlines()[0] == "# my-run"
    assert front_matter(card)["model-index"][0]["name"] == "my-run"
    assert 'hscl_zoo.load("hf-hub:me/my-run")' in card and "https://huggingface.co/me/my-run" in card
    assert "hscl-beta-cifar100" not in body.split("## How to load")[0], "the registry name must not leak into the title"


@pytest.mark.parametrize("results,message", [
    ({"top5": -1.0}, "not a percentage"),
    ({"top1": 175.0}, "not a percentage"),
    ({"top1": "75"}, "finite number"),
    ({"top1": float("nan")}, "finite number"),
])
def test_bad_results_are_rejected(trained_config, results, message):
    with pytest.raises(ValueError, match=message):
        render_card(trained_config, results)


def test_config_without_training_summary_is_rejected(trained_config):
    config = {k: v for k, v in trained_config.items() if k != "training"}
    with pytest.raises(ValueError, match="training summary"):
        render_card(config, {"top1": 70.0})


def test_card_shows_retrieval_and_audit_of_the_evaluation(trained_config):
    evaluation = {
        "top1": 75.3,
        "retrieval": {"recall_at_1": 71.25, "recall_at_5": 88.5, "recall_at_10": 92.0, "precision_at_1": 71.25,
                      "map_at_r": 40.125, "map": 45.5, "queries": 10000, "gallery_size": 50000},
        "audit": {"split": "test", "images": 10000, "alignment": 0.51234, "uniformity": -3.21,
                  "assumption_fraction": 0.875, "class_accuracy": {"apple": 90.0, "bed": 40.0, "cat": float("nan")},
                  "confused_pairs": [{"classes": ["bed", "couch"], "a_as_b": 7, "b_as_a": 5, "rate": 6.0}]},
    }
    card = render_card(trained_config, {"top1": 75.3}, evaluation=evaluation)
    assert "Each of the 10000 test images queries the 50000 training images" in card
    assert "| Recall@1 | 71.25 |" in card and "| MAP@R | 40.12 |" in card and "| mAP | 45.50 |" in card
    assert "| alignment (two views of an image, alpha 2; lower is better) | 0.5123 |" in card
    assert "| uniformity (t 2; lower is better) | -3.2100 |" in card
    assert "| Assumption 1 holds (fraction of test anchors) | 0.8750 |" in card
    assert "Lowest per-class accuracy (linear probe): bed 40.0%, apple 90.0%." in card
    assert "Most-confused class pairs: bed / couch (6.0%)." in card
    assert card.index("### Retrieval") > card.index("| this model | 75.30 |") and card.index("## Limitations") > \
        card.index("### Representation audit")
    assert render_card(trained_config, {"top1": 75.3}, evaluation={"top1": 75.3}) == render_card(
        trained_config, {"top1": 75.3})


def _evidence_results(tmp_path: Path, budget: str, top1: dict[tuple[str, int], float]) -> Path:
    """A results/ folder holding copies of committed cpu-cifar10-10k runs at `budget`, with the
    linear top-1 of each (method, seed) replaced by a value chosen here."""
    runs = tmp_path / "results" / budget / "runs"
    runs.mkdir(parents=True)
    for (method, seed), value in top1.items():
        record = json.loads((ROOT / "results" / "cpu-cifar10-10k" / "runs" / f"{method}-s{seed}.json").read_text())
        (runs / f"{method}-s{seed}.json").write_text(json.dumps({**record, "top1": value}))
    return tmp_path / "results"


def test_registry_card_quotes_the_method_at_its_datasets_evidence_budget(tmp_path):
    results = _evidence_results(tmp_path, "cpu-cifar10-10k", {
        ("scl", 0): 50.0, ("scl", 1): 52.0, ("hscl-beta", 0): 53.0, ("hscl-beta", 1): 56.0})
    card = registry_card(info("hscl-beta-cifar10"), results)
    section = card.split("### H-SCL(β) at CPU budgets (not this model, not the paper's budget)", 1)[1]
    # mean 54.5, sample sd sqrt(2 * 1.5^2) = 2.12; per-seed differences 3 and 4: mean 3.5, standard
    # error 0.5, t(0.975, 1 df) = 12.706: 3.5 -/+ 6.35
    row = next(line for line in section.splitlines() if line.startswith("| `cpu-cifar10-10k`"))
    assert row.startswith("| `cpu-cifar10-10k` | 2 | 54.50 ± 2.12 | ")
    assert row.endswith(" | +3.50 [-2.85, +9.85] |")
    assert "- [`cpu-cifar10-10k`](../results/cpu-cifar10-10k/summary.md): The CPU evidence budget" in section
    assert "[evidence](../results/cpu-cifar10-10k/evidence/summary.md)" not in section
    (results / "cpu-cifar10-10k" / "evidence").mkdir()
    (results / "cpu-cifar10-10k" / "evidence" / "summary.md").write_text("# Evidence\n")
    card = registry_card(info("hscl-beta-cifar10"), results)
    assert "fine-tuning of its seed-0 encoders: [evidence](../results/cpu-cifar10-10k/evidence/summary.md)." in card


def test_checked_in_cards_links_reach_files_of_the_repository():
    """Relative links of model_cards/*.md (the budgets' summaries, their evidence) resolve from that folder."""
    checked = 0
    for card in sorted((ROOT / "model_cards").glob("*.md")):
        for target in re.findall(r"\]\((\.\./[^)#]+)", card.read_text()):
            assert (card.parent / target).is_file(), f"{card.name} links {target}, which does not exist"
            checked += 1
    assert checked >= 10  # the CIFAR-10, CIFAR-100 and Tiny ImageNet cards link their budgets


def test_card_evidence_skips_other_methods_smoke_budgets_and_a_wheel(tmp_path):
    results = _evidence_results(tmp_path, "cpu-cifar10", {("scl", 0): 50.0, ("hscl-beta", 0): 53.0})
    assert "at CPU budgets" not in registry_card(info("hscl-beta-cifar10"), results)
    results = _evidence_results(tmp_path / "b", "cpu-cifar10-10k", {("scl", 0): 50.0})
    assert "at CPU budgets" not in registry_card(info("hscl-beta-cifar10"), results)
    assert "at CPU budgets" in registry_card(info("scl-cifar10"), results)
    assert "at CPU budgets" not in registry_card(info("scl-cifar100"), results)
    assert "at CPU budgets" not in registry_card(info("scl-cifar10"), tmp_path / "absent")


def test_card_evidence_names_cpu_and_gpu_budgets_in_its_heading(tmp_path):
    results = _evidence_results(tmp_path, "cpu-cifar10-10k", {("scl", 0): 50.0, ("hscl-beta", 0): 53.0})
    _evidence_results(tmp_path, "gpu-cifar10", {("scl", 0): 80.0, ("hscl-beta", 0): 82.0})
    card = registry_card(info("hscl-beta-cifar10"), results)
    assert "### H-SCL(β) at CPU and GPU budgets (not this model, not the paper's budget)" in card
    assert "| `gpu-cifar10` | 1 | 82.00 ± 0.00 |" in card


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_a_graph_card_shows_table_2_and_what_its_files_scored(name):
    entry = info(name)
    card = (CARDS / f"{name}.md").read_text()
    header = front_matter(card)
    assert header["pipeline_tag"] == "graph-ml" and {entry.method, "gin-3x32"} <= set(header["tags"])
    assert "datasets" not in header, "TU datasets have no Hub dataset repo"
    paper = "n/a (the method is not in Table 2)" if entry.paper_top1 is None else f"{entry.paper_top1:.1f}"
    assert f"| the paper's Table 2 ({entry.dataset_display}, " in card and f") | {paper} |" in card
    assert f'hscl_zoo.load("{name}")' in card and "## Citation" in card
    if entry.published:
        (result,) = header["model-index"][0]["results"]
        assert [m["value"] for m in result["metrics"]] == [entry.metrics["svm_accuracy"],
                                                          entry.metrics["linear_cv_accuracy"]]
        assert f"seed 0's folds) | {entry.metrics['svm_accuracy']:.2f} |" in card
        assert entry.budget in card and entry.train_command in card
    else:
        assert "model-index" not in header and "Not published yet" in card and entry.train_command in card
