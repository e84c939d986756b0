"""The feature store: a zarr v3 group holding query and gallery features.

Layout (schema version 3)::

    STORE.zarr/                       group attrs: streameval_schema = 3,
                                                   default_metric = "euclidean",
                                                   committed_gallery_rows, store_uid
        query/features   (Nq, D)  float16 | float32, chunked (rows, D): never split along D
        query/pids       (Nq,)    int64   person ids (-1 junk, 0 distractor by convention)
        query/camids     (Nq,)    int64   camera ids
        gallery/features (Ng, D)  as above
        gallery/pids     (Ng,)    int64
        gallery/camids   (Ng,)    int64

The three arrays of a set are chunked by the same number of rows so one chunk of each describes the
same images. Feature values are not compressed (float features do not compress); ids are (zstd).

Damage cannot read as data (what schema 2 adds to schema 1):

* Every chunk ends with a crc32c checksum (zarr's ``crc32c`` codec, the last bytes-to-bytes codec of
  every array): a chunk file overwritten, truncated or garbled fails to decode instead of reading
  as other numbers.
* Fill values no valid row can hold: zarr answers an array's fill value for a chunk whose file is
  missing, so features fill with NaN (refused as a value) and ids with ``ID_FILL`` = INT64_MIN, a
  reserved id: writers refuse it, readers report it as a missing chunk.
* ``committed_gallery_rows``: readers see only the gallery rows written completely (appends write
  the data first, this count last).

A chunk is valid only in its place (what schema 3 adds to schema 2): its stored checksum is XORed
with a tag of the store's uid and the chunk's key (array path and index), applied and removed by
the ``identity.ChunkIdentityStore`` every array of the store is opened on, so zarr's own crc32c
check refuses a chunk file moved, swapped or copied from another store.  Schema 2 stores read as
before (with a warning); ``upgrade_store`` (``streameval validate --upgrade``) binds their chunks.

Every read of chunk data goes through ``read_field``, which turns a damaged or missing chunk into a
:class:`~streameval.core.errors.StoreError` naming the set, the rows and the chunk file.

``open_store`` checks everything that metadata alone can tell (arrays present, dtypes, shapes,
chunking, checksums and fill values) and raises StoreError with a readable message. Values (finite
features, ids) are checked as chunks are read (``read_rows``), so a full scan is never an extra pass
over a large gallery; ``validate_values`` does that scan on demand.

Values are checked before they are written (``check_batch``): finite features whose rows keep their
precision in the stored dtype, ids that fit int64 and are not the reserved fill value.

The package is split by step: ``layout`` (schema constants, FeatureSet / Store, ``open_store``),
``identity`` (chunk checksums bound to their place),
``values`` (checks before writing), ``writing`` (create, fill, append), ``reading`` (chunk reads,
``validate_values``, ``rows_fingerprint``), ``variants`` (named feature variants of a set, beside its
features: docs/variants.md).  Other kinds of sets plug in: a distance store (``distances``) registers
its opener in ``layout.OPENERS``, and a distance set or a stack of variants (``stack``) carries its
``FeatureSet.reader``, so ``layout`` and ``reading`` name neither.  The names below are its public interface.
"""

from . import distances  # noqa: F401 (registers the distance stores' kinds with layout.OPENERS)
from .layout import (COMMITTED_ATTR, DEFAULT_CHUNK_ROWS, FEATURE_DTYPES, FIELDS, ID_FILL, METRICS, SCHEMA_VERSION, SETS,
                     FeatureSet, Store, describe, is_local_path, open_group, open_store)
from .reading import read_features, read_field, read_ids, read_rows, rows_fingerprint, validate_values
from .values import check_batch, check_features, check_ids, check_metric, feature_dtype, row_number
from .variants import CLEAN, variant_attrs, variant_columns, variant_names, variant_set, write_variant
from .writing import (append_batches, append_gallery, appendable, array_dtype, commit_gallery, create_store,
                      estimated_bytes, new_store, refuse_existing, upgrade_store, write_rows, write_store)

__all__ = [
    "COMMITTED_ATTR", "DEFAULT_CHUNK_ROWS", "FEATURE_DTYPES", "FIELDS", "ID_FILL", "METRICS", "SCHEMA_VERSION",
    "SETS", "FeatureSet", "Store", "describe", "is_local_path", "open_group", "open_store", "read_features", "read_field", "read_ids", "read_rows",
    "rows_fingerprint", "validate_values", "check_batch", "check_features", "check_ids", "check_metric",
    "feature_dtype", "row_number", "append_batches", "append_gallery", "appendable", "array_dtype", "commit_gallery", "create_store",
    "estimated_bytes", "new_store", "refuse_existing", "upgrade_store", "write_rows", "write_store", "CLEAN", "variant_attrs",
    "variant_columns", "variant_names", "variant_set", "write_variant",
]
