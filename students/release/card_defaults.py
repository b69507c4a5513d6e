"""What the model card says when ``export`` is not told otherwise: the one definition that the
library (:func:`students.release.export.export_student`, :func:`students.release.card.model_card`)
and the ``export`` flags share.

Importing it loads no torch: ``bytedistill export --help`` builds its parser from it.
"""

LICENSE = "apache-2.0"  # the card's metadata license (--license)
