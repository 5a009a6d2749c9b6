"""Augmented handwritten digits: scikit-learn's 1,797 8 x 8 digits, moved to any size.

Real images whose neighbourhoods are not a noise floor over a smooth curve (the sinusoid's):
each row is one of ``load_digits``' images (shipped with scikit-learn, nothing downloaded)
shifted by a fraction of a pixel or more, rotated by a few degrees and scaled by a few percent
about the image's centre (``scipy.ndimage.affine_transform``, bilinear), the standard
augmentation of digit images (Simard, Steinkraus & Platt 2003, "Best practices for
convolutional neural networks applied to visual document analysis", §2). The label is the
digit's; the latent is the transform (and the source image), which a neighbour graph of such
rows should follow.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import ndimage

logger = logging.getLogger(__name__)

#: The transform's ranges: shift in pixels (each axis), rotation in degrees, scale factor.
MAX_SHIFT = 1.0
MAX_ROTATION = 10.0
SCALE_RANGE = (0.9, 1.1)


def augmented_digits(n_samples: int, random_state: int | None = 0, *,
                     max_shift: float = MAX_SHIFT, max_rotation: float = MAX_ROTATION,
                     scale_range: tuple[float, float] = SCALE_RANGE,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_samples`` augmented 8 x 8 digits, seeded.

    Parameters
    ----------
    n_samples : int
        T rows (any number >= 1; the 1,797 source images are drawn with replacement).
    random_state : int or None, default=0
        Seeds the source images and the transforms: the same seed gives the same rows.
    max_shift : float, default=1.0
        Largest shift along each axis, in pixels (uniform in ``[-max_shift, max_shift]``).
    max_rotation : float, default=10.0
        Largest rotation about the image's centre, in degrees (uniform, either way).
    scale_range : (float, float), default=(0.9, 1.1)
        The scale factor's range (uniform), about the centre.

    Returns
    -------
    X : ndarray of shape (T, 64), float32
        The transformed images, pixel values in [0, 1] (the source's 0-16 over 16).
    labels : ndarray of shape (T,), int64
        The digit (0-9).
    latent : ndarray of shape (T, 5), float64
        Per row: the source image's index in ``load_digits``, the shifts (rows, columns, in
        pixels), the rotation (degrees) and the scale.

    Examples
    --------
    >>> from dr_dask.datasets import augmented_digits
    >>> X, labels, latent = augmented_digits(500, random_state=0)
    >>> X.shape, X.dtype, labels.shape, latent.shape
    ((500, 64), dtype('float32'), (500,), (500, 5))
    """
    from sklearn.datasets import load_digits  # lazy: the generators import no sklearn at top

    T = int(n_samples)
    if T < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    for name, value in (("max_shift", max_shift), ("max_rotation", max_rotation)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    lo, hi = (float(s) for s in scale_range)
    if not (0 < lo <= hi and np.isfinite(hi)):
        raise ValueError(f"scale_range must be (low, high) with 0 < low <= high, got "
                         f"{scale_range}")
    digits = load_digits()
    images = digits.images.astype(np.float64) / 16.0
    rng = np.random.default_rng(random_state)
    source = rng.integers(0, len(images), T)
    shift = rng.uniform(-max_shift, max_shift, (T, 2))
    angle = rng.uniform(-max_rotation, max_rotation, T)
    scale = rng.uniform(lo, hi, T)
    centre = (np.array(images.shape[1:]) - 1) / 2.0
    X = np.empty((T, images.shape[1] * images.shape[2]), dtype=np.float32)
    theta = np.deg2rad(angle)
    for t in range(T):
        c, s = np.cos(theta[t]), np.sin(theta[t])
        # affine_transform maps output coordinates to input ones: the inverse of
        # "scale and rotate about the centre, then shift"
        inverse = np.array([[c, s], [-s, c]]) / scale[t]
        offset = centre - inverse @ (centre + shift[t])
        X[t] = ndimage.affine_transform(images[source[t]], inverse, offset=offset, order=1,
                                        mode="constant", cval=0.0).ravel()
    labels = digits.target[source].astype(np.int64)
    latent = np.column_stack([source, shift, angle, scale]).astype(np.float64)
    logger.debug("augmented digits: %d rows from %d source images", T, len(np.unique(source)))
    return X, labels, latent
