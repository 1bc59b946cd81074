"""A folder of images by class -> Examples.

    root/<class name>/**/<image>.png|jpg|...

Sub-folder names, sorted, are the classes. Each image is decoded with Pillow, converted to RGB,
resized to image_size (height, width) and scaled to [0, 1]: feature shape [height, width, 3].
Files that are not images by extension (README.txt, .DS_Store) are ignored.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples, make_examples

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def visible(entries: list[Path]) -> list[Path]:
    return sorted(p for p in entries if not p.name.startswith((".", "__MACOSX")))


def read_image_folder(root: Path, image_size: tuple[int, int], budget: StagingBudget) -> Examples:
    classes = [d for d in visible(list(root.iterdir())) if d.is_dir()]
    if len(classes) < 2:
        found = f"only {classes[0].name!r}" if classes else "none"
        raise DatasetError(f"an image folder needs at least 2 class folders (one per class), found {found}")
    files: list[Path] = []
    labels: list[int] = []
    for label, class_dir in enumerate(classes):
        images = [p for p in visible(list(class_dir.rglob("*"))) if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()]
        if not images:
            raise DatasetError(f"class folder {class_dir.name!r} has no images ({', '.join(IMAGE_EXTENSIONS)})")
        files += images
        labels += [label] * len(images)
    height, width = image_size
    pixels = np.empty((len(files), height, width, 3), dtype=np.uint8)

    def decode(i: int) -> None:
        budget.check_stop()
        pixels[i] = _load_rgb(files[i], root, (width, height))

    # Pillow releases the GIL while decoding, so threads use every core.
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(decode, range(len(files))))
    x = pixels.astype(np.float32) / np.float32(255.0)
    return make_examples(x, np.asarray(labels), root.name, class_names=[d.name for d in classes])


def _load_rgb(path: Path, root: Path, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # lazy: only image folders need Pillow

    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{path.relative_to(root)} is not a readable image ({type(exc).__name__})") from None
