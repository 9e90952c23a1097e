"""Fine-tune an encoder into a classifier (the same command as `hscl-zoo finetune`).

    accelerate launch recipes/finetune.py runs/default/hub --dataset digits --epochs 5
    accelerate launch recipes/finetune.py hscl-beta-cifar10 --data_dir ../shared/data/cifar10 --freeze_stages 2
    accelerate launch recipes/finetune.py runs/default/hub --contrastive_weight 0.5 --method hscl-beta --beta 2

The loop is `hscl_zoo.training.finetune`; its docstring says what a run writes, and
`--help` lists every option. docs/finetuning.md describes the protocol.
"""

from hscl_zoo.training.finetune import main

if __name__ == "__main__":
    main()
