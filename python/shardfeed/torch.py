"""shardfeed.torch: shardfeed batches as PyTorch tensors.

``ShardDataset`` is a ``torch.utils.data.IterableDataset`` for
``DataLoader(ds, batch_size=None, num_workers=0)``; ``to_tensors(batch)``
turns one :class:`shardfeed.Batch` into ``(images, labels)`` tensors.

torch is imported when one of them is first used, not when this module is
imported (and ``import shardfeed`` never imports this module).
See docs/python.md.
"""
from . import _shardfeed
from ._loader import Loader, _config_error

__all__ = ["ShardDataset", "to_tensors"]

_FIXED_KEYS = ("images", "labels", "keys", "pad")

_WORKER_MESSAGE = (
    "shardfeed.torch.ShardDataset runs in the main process only: use "
    "DataLoader(ds, batch_size=None, num_workers=0). The shardfeed loader is already "
    "parallel inside one process (decode_threads decode workers, prefetch_shards shard "
    "downloads, a ring of prefetch_batches batches); in DataLoader worker processes each "
    "worker would open its own loader and stream the whole dataset, delivering every "
    "sample num_workers times. Set decode_threads where you would set num_workers.")


def _torch():
    import torch  # the real torch: absolute imports do not find this module

    return torch


def _to_device(t, device):
    """t on device, copied if needed. A host tensor goes through torch's own
    pinned memory, so the asynchronous copy never reads a ring slot that the
    loader may reuse once the caller drops its references."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        # pin_memory() copies into torch's caching host allocator, which keeps
        # the block until the copy recorded on the current stream has run.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_tensors(batch, device=None):
    """``(images, labels)`` torch tensors of a :class:`shardfeed.Batch`.

    ``device=None``: images where the loader delivered them (zero copy: a
    view of the loader's ring, on the GPU for device batches) and labels on
    the same device (zero copy on the host; on the GPU a copy of 8 bytes a
    sample, queued on the current stream). ``device="cpu"`` on a device batch
    gives the host images (zero copy) rather than a copy back from the GPU.
    Another device copies what is elsewhere; a host-to-GPU copy goes through
    torch's pinned memory and is asynchronous on the current stream.

    Tensors that view the ring keep their slot from being reused until they
    are freed (docs/python.md, "Lifetimes"). GPU views are ordered after the
    loader's copy on the current stream (DLPack's stream protocol): no host
    synchronisation.
    """
    torch = _torch()
    if device is not None:
        device = torch.device(device)
    if device is not None and device.type == "cpu" and batch.on_device:
        images = torch.from_dlpack(batch.host_images)
    else:
        images = torch.from_dlpack(batch.images)
    if device is None:
        device = images.device
    images = _to_device(images, device)
    labels = _to_device(torch.from_dlpack(batch.labels), device)
    return images, labels


class _Items:
    """The items of one epoch of a ShardDataset. Not a generator: an
    exception (LimitError when too many items are held, a failure,
    KeyboardInterrupt) leaves it usable, as the loader's own iterator, where
    a generator would end and a DataLoader take that for the end of the
    epoch. The loader's iteration starts at the first next(), so a
    set_epoch() between iter(dataloader) and the loop still counts."""

    __slots__ = ("_dataset", "_batches")

    def __init__(self, dataset):
        self._dataset = dataset
        self._batches = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._batches is None:
            if _torch().utils.data.get_worker_info() is not None:
                raise _config_error(_WORKER_MESSAGE)
            self._batches = iter(self._dataset.loader)
        return self._dataset._item(next(self._batches))


def _make_dataset_class():
    torch = _torch()

    class ShardDataset(torch.utils.data.IterableDataset):
        """A shardfeed loader as a PyTorch ``IterableDataset`` of whole batches.

        ``ShardDataset(sources, *, config=None, **options)`` takes the
        arguments of :class:`shardfeed.Loader`. Use it with
        ``DataLoader(ds, batch_size=None, num_workers=0)`` (the batches are
        already made; the loader is parallel inside this process), or iterate
        it directly. Each item is a dict::

            {"images": uint8 (n, 3, H, W) tensor (or the layout/dtype asked),
             "labels": int64 (n,) tensor, -1 where a sample has no label,
             "keys": list of str, "pad": bool (n,) tensor (padding repeats),
             <extra field>: list of bytes, for each of extra_fields}

        Images are zero-copy views of the loader's ring, on the GPU when
        the loader delivers there; labels and pad are on the images' device.

        rank / world_size, when not given: an initialised torch.distributed,
        else torchrun's RANK / WORLD_SIZE (the GPU is LOCAL_RANK's). Call
        :meth:`set_epoch` each epoch as with DistributedSampler, or let each
        new iteration start the next epoch. The loader opens on first use
        (after ``init_process_group``), not in the constructor.
        """

        def __init__(self, sources, *, config=None, **options):
            super().__init__()
            self.sources = sources
            self.config = config
            self.options = dict(options)
            self._loader = None

        # -- the loader ------------------------------------------------
        @property
        def loader(self):
            """The :class:`shardfeed.Loader` (opened on first use)."""
            if self._loader is None:
                if torch.utils.data.get_worker_info() is not None:
                    raise _config_error(_WORKER_MESSAGE)
                # rank / world size: Loader takes an initialised
                # torch.distributed's, and the C library reads RANK and
                # WORLD_SIZE (strictly: docs/sampling.md) when neither says.
                self._loader = Loader(self.sources, config=self.config, **self.options)
            return self._loader

        def __getstate__(self):
            # Pickled for worker processes or spawn: the open loader (threads,
            # ring memory) cannot travel; the copy opens its own, or refuses
            # in a DataLoader worker.
            state = self.__dict__.copy()
            state["_loader"] = None
            return state

        # -- iteration -------------------------------------------------
        def __iter__(self):
            return _Items(self)

        @staticmethod
        def _item(batch):
            images, labels = to_tensors(batch)
            pad = torch.tensor(batch.pad, dtype=torch.bool)
            item = {"images": images, "labels": labels, "keys": list(batch.keys),
                    "pad": _to_device(pad, images.device)}
            for name, values in batch.fields.items():
                if name in _FIXED_KEYS:
                    raise _config_error(
                        f"extra field {name!r}: ShardDataset items use that key for "
                        f"their own; read it through shardfeed.Loader (batch.fields)")
                item[name] = list(values)
            batch.release()  # the tensors keep the ring slot while they live
            return item

        def __len__(self):
            """Batches of this rank's epoch (an estimate until
            ``loader.epoch_size_known``)."""
            return len(self.loader)

        # -- epochs and checkpoints -----------------------------------
        def set_epoch(self, epoch):
            """The next iteration reads epoch ``epoch`` from its beginning."""
            if self._loader is None:
                self.options["epoch"] = int(epoch)
            else:
                self._loader.set_epoch(epoch)

        @property
        def epoch(self):
            if self._loader is not None:
                return self._loader.epoch
            epoch = self.options.get("epoch")
            return 0 if epoch is None else int(epoch)  # None keeps the default

        def state_dict(self):
            """The position of the batches delivered so far (plain Python
            types: torch.save and torchdata's StatefulDataLoader keep it)."""
            return self.loader.state_dict()

        def load_state_dict(self, state):
            """Continues from a :meth:`state_dict` of a dataset with the same
            sources and options: the next item is the first batch not
            delivered before the save."""
            self.loader.load_state_dict(state)

        def stats(self):
            """The loader's counters (:meth:`shardfeed.Loader.stats`)."""
            return self.loader.stats()

        def close(self):
            """Stops the loader; tensors still alive keep their memory. The
            next use opens a new one at the epoch the next iteration would
            have read (the one set last with :meth:`set_epoch`, or the next
            after an epoch read to its end), from its beginning."""
            if self._loader is not None:
                loader, self._loader = self._loader, None
                try:
                    if not loader.closed:
                        self.options["epoch"] = loader._next_epoch()
                finally:
                    loader.close()

        def __repr__(self):
            state = repr(self._loader) if self._loader is not None else "not opened"
            return f"shardfeed.torch.ShardDataset({state})"

    ShardDataset.__module__ = __name__
    ShardDataset.__qualname__ = "ShardDataset"
    return ShardDataset


def __getattr__(name):
    # ShardDataset derives from torch's IterableDataset, so it is made when
    # first asked for: importing this module does not import torch.
    if name == "ShardDataset":
        cls = _make_dataset_class()
        globals()["ShardDataset"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
