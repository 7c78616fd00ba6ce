"""The float64 (and mpmath) reference: geometries, update rules and their building blocks.

Pure NumPy/SciPy/mpmath; the ground truth the torch port is validated against.
"""

from reference import linalg, mp, optim
from reference.euclidean import Euclidean
from reference.geometry import Geometry
from reference.product import Product
from reference.stiefel import Stiefel

__all__ = ["Euclidean", "Geometry", "Product", "Stiefel", "linalg", "mp", "optim"]
