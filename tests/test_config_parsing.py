import pytest

from hscl_zoo.training.config import PretrainConfig, parse_overrides


def test_command_line_values_keep_their_types():
    cfg = PretrainConfig.from_sources(None, parse_overrides(
        ["--mixed_precision", "no", "--epochs=3", "--lr", "1e-2", "--data_dir", "none", "--gpu_augment", "true", "--M", "7"]))
    assert (cfg.mixed_precision, cfg.epochs, cfg.lr, cfg.data_dir, cfg.gpu_augment, cfg.M) == ("no", 3, 0.01, None, True, 7.0)


def test_yaml_no_is_the_string_no(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("mixed_precision: no\nepochs: 2\n")
    assert PretrainConfig.from_sources(path).mixed_precision == "no"


@pytest.mark.parametrize("argv, match", [
    (["--epochs", "many"], "epochs='many' must be int"),
    (["--lrr", "0.1"], "did you mean 'lr'"),
    (["--mixed_precision", "fp8"], "'no' or 'bf16'"),
    (["--mixed_precision", "fp16"], "gradient scaler would only skip a step"),
    (["--epochs"], "needs a value"),
])
def test_bad_command_lines(argv, match):
    with pytest.raises(ValueError, match=match):
        PretrainConfig.from_sources(None, parse_overrides(argv))
