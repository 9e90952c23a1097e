"""The image model card's Markdown: the Hub's front matter, then its sections in order, each a
``$placeholder`` that :func:`hscl_zoo.zoo.cards.render_card` fills from the zoo entry or the run."""

from __future__ import annotations

import string

from hscl_zoo.zoo import registry

__all__ = ["CARD_TEMPLATE"]

CARD_TEMPLATE = string.Template("""\
---
${front_matter}---

# ${name}

${status}

${description}

## How to load

```python
import hscl_zoo; from PIL import Image
model = hscl_zoo.load("${load_source}")
probs = model.predict(Image.open("image.png"))  # (1, ${num_classes}) class probabilities
```

`model.class_names[i]` names class `i`; `model.encode(x)` gives the ${backbone} features the
linear head reads, `model.project(x)` the L2-normalised ${proj_dim}-d projection used in training.
`model.transform` is the preprocessing below, as a torchvision transform.

## Preprocessing

${preprocessing}

## Training

${training}

## Results

Top-1 accuracy (%) of the linear classifier on frozen encoder features, on the ${dataset_display}
evaluation split, beside Table 1 of the paper (ResNet-50, 200 epochs).

${results}

## Limitations

- Trained on ${dataset_display} only (${num_classes} classes at ${native_size}x${native_size} pixels): the linear
  head knows no other classes, and the features are untested on other domains or resolutions.
- A linear probe on frozen features, not a fine-tuned classifier; numbers are single runs unless
  stated, and the paper's numbers come from its own code and hardware.
- Contrastive features inherit the biases of the dataset's images and labels; do not use the
  model for decisions about people.

## Citation

""" + registry.PAPER_BIBTEX.replace("$", "$$"))
