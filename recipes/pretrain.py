"""Pretrain a contrastive encoder with one of the paper's objectives, then probe and export it.

    accelerate launch recipes/pretrain.py                                  # embedded digits, CPU, minutes
    accelerate launch recipes/pretrain.py --config hscl-beta-cifar100
    accelerate launch recipes/pretrain.py --config scl-cifar10 \
        --data_dir ../shared/data/cifar10 --epochs 5
    accelerate launch recipes/pretrain.py --output_dir runs/x --resume     # continue an interrupted run

The loop is `hscl_zoo.training.pretrain`; its docstring lists what a run writes. Every key of
`hscl_zoo.training.config.PretrainConfig` can be set as `--key value` (after the YAML file).
"""

from hscl_zoo.training import main

if __name__ == "__main__":
    main()
