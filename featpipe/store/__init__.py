"""The artifact store: stages, keys, atomic item writes, ledgers, resume, names and models.

Layout (docs/store.md)::

    STORE/stages/<kind>-<key>/stage.json        kind, params, input keys, versions, host, created
                             /items.csv         the manifest rows this stage covers
                             /items/<2 hex>/<safe id>.npy          one array per item
                             /items/<2 hex>/<safe id>+<extra>.npy  sidecars (timestamps...)
                             /ledger/<host>-<pid>.jsonl            id, status, seconds, error
                             /models/<name>.npz + <name>.json      fitted objects
    STORE/names/<NAME>                          text: the stage folder a friendly name points to

:class:`Store` and :class:`Stage` (:mod:`featpipe.store.facade`) are what the rest of featpipe
uses; each hands its work to the module that owns the concept, one file each:

==============  ===========================================================================
``layout``      the store's folders: stage folder names, ``is_store``, the scan, writability
``keys``        the stage key and the canonical parameters it hashes
``records``     ``stage.json`` and the record files it sums (``items.csv``...); damage
``ledger``      ledger lines: the writer, the parser, the problems, the states of all lines
``index``       the ledgers folded into one record and table (O(ledgers) counts)
``states``      an item's folded state looked up (done, failed, its checksums, its batch)
``items``       item files: atomic writes, checked reads (loose, batched, packed), done ids
``item_files``  an item written row by row as its frames arrive (RowFile, ItemFiles)
``batches``     small items committed together in one batch file
``packed``      reading the HDF5 files ``cache pack`` writes
``pack``        ``cache pack`` itself, and the repair of packed files
``views``       a stage whose items are columns of its input's
``models``      a fit stage's model files
``running``     the markers and locks of the processes computing a stage
``names``       friendly names and the pointers they hold
``content``     the content-hash cache and the hashes a stage key was computed from
``file_kinds``  every kind of file a store holds, its checksum and its recovery
==============  ===========================================================================

A stage's key hashes its kind, its canonical parameter record, the keys of its inputs and
:data:`featpipe.FORMAT_VERSION`, so the same work always lands in the same folder and a
changed parameter lands in a new one.  Item writes are atomic (temporary file in the same
folder, flush, fsync, ``os.replace``); an item counts as done only when a ledger line says so
*and* its file exists, so a process killed at any moment loses at most the items it was
computing.  No pickle anywhere: arrays are ``.npy``/``.npz`` read with ``allow_pickle=False``.

A store is read defensively: a name resolves only to a stage folder of the same store, a
corrupt ``stage.json``, ledger line, item header or model is a one-line
:class:`~featpipe.errors.FeatpipeError` naming the file, and a write that fails (disk full,
read-only store) is a :class:`~featpipe.errors.WriteError` that leaves no partial ledger line.
"""

from featpipe.checksums import DamagedItem
from featpipe.store.facade import Stage, Store
from featpipe.store.keys import stage_key
from featpipe.store.layout import CACHE_NAME, CREATION_GRACE_S, STAGE_FOLDER, is_store
from featpipe.store.ledger import ledger_owner
from featpipe.store.models import MODEL_SUMS
from featpipe.store.names import NAME_PATTERN, DamagedName, pointer_bytes
from featpipe.store.records import REPAIR_STAGE, DamagedRecord, DamagedStage, record_owner
from featpipe.store.running import RUNNING_DIR
from featpipe.store.views import VIEW_FILE, view_bytes

__all__ = [
    "CACHE_NAME", "CREATION_GRACE_S", "MODEL_SUMS", "NAME_PATTERN", "REPAIR_STAGE",
    "RUNNING_DIR", "STAGE_FOLDER", "VIEW_FILE", "DamagedItem", "DamagedName", "DamagedRecord",
    "DamagedStage", "Stage", "Store", "is_store", "ledger_owner", "pointer_bytes",
    "record_owner", "stage_key", "view_bytes",
]
