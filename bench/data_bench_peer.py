"""The data benchmark's peers, one rank per process (RANK, WORLD_SIZE from the environment,
as `dtrain run` sets them), each delivering the Fashion-MNIST Parquet table's batches to a
training loop that does nothing with them, as bench/data_bench.cpp does for dtrain::data:
float32 [B, 784] images and int64 [B] labels as torch tensors.

    python data_bench_peer.py petastorm DIR [--epochs N] [--batch-size B]
        Petastorm's PyTorch reader: make_batch_reader(cur_shard=rank, shard_count=world)
        (row groups split across ranks, shuffled, its default thread pool of 10 workers) and
        petastorm.pytorch.DataLoader. Runs in bench/petastorm_env.sh's venv.
    python data_bench_peer.py dataloader DIR [...]
        torch.utils.data.DataLoader (2 worker processes) over an IterableDataset that reads
        this rank's row groups (DistributedSampler's split: every world-th, shuffled per epoch)
        with pyarrow.parquet and yields batches. Runs in the project's venv.
Prints one JSON line: {"rank", "samples", "seconds", "samples_per_s", "peak_rss_mb"}.
"""
import argparse
import glob
import json
import os
import resource
import time

import torch


def petastorm_epochs(path, rank, world, epochs, batch):
    from petastorm import make_batch_reader
    from petastorm.pytorch import DataLoader
    reader = make_batch_reader("file://" + os.path.abspath(path), num_epochs=epochs,
                               cur_shard=rank, shard_count=world, shuffle_row_groups=True,
                               schema_fields=["image", "label"])
    with DataLoader(reader, batch_size=batch) as loader:
        for b in loader:
            yield b["image"].float(), b["label"].long()


class RowGroups(torch.utils.data.IterableDataset):
    """This rank's row groups of the table, read with pyarrow, as batches of tensors."""

    def __init__(self, path, rank, world, batch, epoch):
        import pyarrow.parquet as pq
        self.files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
        self.groups = [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]
        self.rank, self.world, self.batch, self.epoch = rank, world, batch, epoch

    def __iter__(self):
        import numpy as np
        import pyarrow.parquet as pq
        gen = torch.Generator()
        gen.manual_seed(self.epoch)
        order = torch.randperm(len(self.groups), generator=gen).tolist()
        mine = order[self.rank::self.world]
        info = torch.utils.data.get_worker_info()
        if info is not None:  # each DataLoader worker its share of this rank's groups
            mine = mine[info.id::info.num_workers]
        for i in mine:
            f, g = self.groups[i]
            t = pq.ParquetFile(f).read_row_group(g, columns=["image", "label"])
            img = t.column("image").combine_chunks()
            pixels = np.asarray(img.values).reshape(len(t), 784)
            images = torch.from_numpy(pixels.astype(np.float32))
            labels = torch.from_numpy(t.column("label").to_numpy().astype(np.int64))
            for s in range(0, len(t), self.batch):
                yield images[s:s + self.batch], labels[s:s + self.batch]


def dataloader_epochs(path, rank, world, epochs, batch):
    for e in range(epochs):
        loader = torch.utils.data.DataLoader(RowGroups(path, rank, world, batch, e), batch_size=None,
                                             num_workers=2)
        for images, labels in loader:
            yield images, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", choices=["petastorm", "dataloader"])
    ap.add_argument("path")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    epochs = petastorm_epochs if a.peer == "petastorm" else dataloader_epochs
    samples, check = 0, 0
    t0 = time.perf_counter()
    for images, labels in epochs(a.path, rank, world, a.epochs, a.batch_size):
        assert images.dtype == torch.float32 and images.shape[1] == 784
        samples += labels.shape[0]
        check += int(labels[0])
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"rank": rank, "samples": samples, "seconds": round(secs, 4),
                      "samples_per_s": round(samples / secs, 1), "peak_rss_mb": round(rss, 1)}),
          flush=True)


if __name__ == "__main__":
    main()
