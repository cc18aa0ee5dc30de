"""The helpers package installs the TensorFlow side of ``setup()``/``device_report()`` when it
is imported; importing it here as well keeps these tests independent of that."""

import helpers.tf.runtime  # noqa: F401
