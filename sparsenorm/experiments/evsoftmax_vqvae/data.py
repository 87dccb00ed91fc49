"""Images for the VQ-VAE experiment: Fashion-MNIST (default), MNIST, or the user's ImageFolder directory.

Every loader returns an :class:`ImageSet`: float32 images ``(N, C, H, W)`` in [-1, 1] (the paper
normalises tinyImageNet to [-1, 1]) with int64 labels, split into train / validation / test.

``--data-dir DIR`` is read, in order, as:

* an ImageFolder-style directory (e.g. real tinyImageNet): ``DIR/train/<class>/**/<image>``
  (png/jpg/jpeg/bmp/gif, any depth below the class folder, so tinyImageNet's ``train/<wnid>/images/``
  works), with an optional test split ``DIR/val/<class>/...`` or ``DIR/test/<class>/...``, or
  tinyImageNet's ``DIR/val/images/`` + ``DIR/val/val_annotations.txt``. Without a test split the
  images are split 80/10/10 (seeded); with one, a seeded tenth of the training images is the
  validation split. Images are resized to ``image_size`` (default: their own size when all agree,
  else 64) and kept grey when every image is grey, else RGB;
* otherwise the data set's own files or cache folder (see :mod:`.._shared.fashion_mnist`,
  :mod:`.._shared.mnist`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..._text import UserFacingError
from .._shared import provenance
from .._shared.fashion_mnist import CLASS_NAMES as FASHION_CLASSES, load_fashion_mnist
from .._shared.mnist import IMAGE_SIDE, MNIST, load_mnist, split_fingerprint

DATASETS = ("fashion-mnist", "mnist")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
TEST_FOLDERS = ("val", "test")


@dataclass(frozen=True)
class ImageSet:
    """Images ``(N, C, H, W)`` float32 in [-1, 1], labels int64 ``(N,)``, per split."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    class_names: Tuple[str, ...]
    source: str

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def shape(self) -> Tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])

    def sizes(self) -> Dict[str, int]:
        return {"train": len(self.train_y), "val": len(self.val_y), "test": len(self.test_y)}

    def fingerprint(self) -> str:
        """A short hash of the training split (names cached models trained on it)."""
        return split_fingerprint(self.train_x, self.train_y)


def _from_mnist(data: MNIST, name: str, class_names: Sequence[str]) -> ImageSet:
    def images(x: np.ndarray) -> np.ndarray:
        return (x.reshape(len(x), 1, IMAGE_SIDE, IMAGE_SIDE) * 2 - 1).astype(np.float32)

    return ImageSet(name, images(data.train_images), data.train_labels, images(data.val_images), data.val_labels,
                    images(data.test_images), data.test_labels, tuple(class_names), data.source)


def load_images(dataset: str = "fashion-mnist", data_dir: Optional[Path] = None, *, image_size: Optional[int] = None,
                seed: int = 0, fetch: bool = True) -> ImageSet:
    """The experiment's images: the user's ImageFolder in ``data_dir`` if there is one, else ``dataset``."""
    if dataset not in DATASETS:
        raise UserFacingError(f"--dataset {dataset!r} is unknown; choose one of {', '.join(DATASETS)}")
    if data_dir is not None and _is_image_folder(Path(data_dir).expanduser()):
        images = load_image_folder(Path(data_dir).expanduser(), image_size=image_size, seed=seed)
        provenance.record_user_path(Path(data_dir).expanduser(), "ImageFolder (--data-dir)")
        return images
    if image_size not in (None, IMAGE_SIDE):
        raise UserFacingError(f"--image-size {image_size}: {dataset} images are {IMAGE_SIDE}x{IMAGE_SIDE}; the option "
                              f"applies to an ImageFolder --data-dir only")
    if dataset == "mnist":
        return _from_mnist(load_mnist(data_dir, fetch=fetch), "MNIST", [str(d) for d in range(10)])
    return _from_mnist(load_fashion_mnist(data_dir, fetch=fetch), "Fashion-MNIST", FASHION_CLASSES)


# ---------------------------------------------------------------- ImageFolder

def _class_dirs(folder: Path) -> List[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _images_below(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _is_image_folder(folder: Path) -> bool:
    return folder.is_dir() and any(_images_below(c) for c in _class_dirs(folder / "train"))


def _test_split(root: Path, classes: List[str]) -> Optional[List[Tuple[Path, int]]]:
    index = {c: i for i, c in enumerate(classes)}
    for name in TEST_FOLDERS:
        folder = root / name
        annotations = folder / "val_annotations.txt"
        if annotations.is_file():  # tinyImageNet: val/images/<file> with "<file>\t<wnid>\t..." lines
            items = []
            for line in annotations.read_text().splitlines():
                parts = line.split("\t")
                if len(parts) >= 2 and parts[1] in index and (folder / "images" / parts[0]).is_file():
                    items.append((folder / "images" / parts[0], index[parts[1]]))
            if items:
                return items
        dirs = [d for d in _class_dirs(folder) if d.name in index]
        items = [(p, index[d.name]) for d in dirs for p in _images_below(d)]
        if items:
            return items
    return None


def _read_images(items: List[Tuple[Path, int]], size: int, grey: bool) -> Tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    images = np.empty((len(items), 1 if grey else 3, size, size), dtype=np.float32)
    for i, (path, _) in enumerate(items):
        try:
            with Image.open(path) as img:
                img = img.convert("L" if grey else "RGB")
                if img.size != (size, size):
                    img = img.resize((size, size), Image.BILINEAR)
                arr = np.asarray(img, dtype=np.float32) / 127.5 - 1
        except OSError as exc:
            raise UserFacingError(f"cannot read image {path}: {exc}") from None
        images[i] = arr[None] if grey else arr.transpose(2, 0, 1)
    return images, np.array([label for _, label in items], dtype=np.int64)


def load_image_folder(root: Path, *, image_size: Optional[int] = None, seed: int = 0) -> ImageSet:
    """An ImageFolder-style directory (see the module docstring)."""
    from PIL import Image

    class_dirs = [d for d in _class_dirs(root / "train") if _images_below(d)]
    if len(class_dirs) < 2:
        raise UserFacingError(f"--data-dir {root}: an image folder needs train/<class>/ folders for at least two "
                              f"classes, found {len(class_dirs)}")
    classes = [d.name for d in class_dirs]
    train = [(p, i) for i, d in enumerate(class_dirs) for p in _images_below(d)]
    test = _test_split(root, classes)
    modes, sizes = set(), set()
    for path, _ in train[:: max(1, len(train) // 200)]:  # a sample decides grey/RGB and the native size
        with Image.open(path) as img:
            modes.add(img.mode)
            sizes.add(img.size)
    grey = modes <= {"L", "1", "I;16", "I"}
    size = image_size or (next(iter(sizes))[0] if len(sizes) == 1 and len(set(next(iter(sizes)))) == 1 else 64)
    if size % 4:
        raise UserFacingError(f"--image-size {size}: the VQ-VAE halves the side twice, so it must be a multiple of 4")
    rng = np.random.default_rng(seed)
    if test is None:  # seeded 80/10/10 split
        order = rng.permutation(len(train))
        n_test = n_val = max(1, len(train) // 10)
        test = [train[i] for i in order[:n_test]]
        val = [train[i] for i in order[n_test:n_test + n_val]]
        train = [train[i] for i in order[n_test + n_val:]]
    else:
        order = rng.permutation(len(train))
        n_val = max(1, len(train) // 10)
        val = [train[i] for i in order[:n_val]]
        train = [train[i] for i in sorted(order[n_val:])]
    if not train or not val or not test:
        raise UserFacingError(f"--data-dir {root}: too few images to split into train/validation/test")
    splits = [_read_images(items, size, grey) for items in (train, val, test)]
    (xtr, ytr), (xva, yva), (xte, yte) = splits
    return ImageSet(root.name, xtr, ytr, xva, yva, xte, yte, tuple(classes),
                    f"ImageFolder {root} ({'grey' if grey else 'RGB'}, {size}x{size})")
