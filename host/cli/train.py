"""`insitu train`: on-device training on a board or its simulated twin."""

from __future__ import annotations

import click

from insitu.cli.output import emit_json, progress, report
from insitu.errors import InsituError
from insitu.io import atomic_write_json, check_writable
from insitu.training import ALGORITHMS, MODELS, TrainConfig, train


def _algo_help() -> str:
    return "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS.values())


@click.command("train")
@click.option("--board", default=TrainConfig.board, show_default=True,
              help="Board or simulated twin (see `insitu boards`).")
@click.option("--algo", default=TrainConfig.algo, show_default=True,
              help=f"Training algorithm. {_algo_help()}.")
@click.option("--dataset", default=TrainConfig.dataset, show_default=True,
              help="Dataset (see `insitu data list`).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the dataset's IDX files (default: where Debian installs it).")
@click.option("--model", type=click.Choice(sorted(MODELS)), default=TrainConfig.model, show_default=True,
              help="Network for the sgd algorithm.")
@click.option("--samples", type=int, default=TrainConfig.samples, show_default=True,
              help="Training samples to stream (60000 is one FashionMNIST epoch).")
@click.option("--batch-size", type=int, default=TrainConfig.batch_size, show_default=True)
@click.option("--lr", type=float, default=TrainConfig.lr, show_default=True, help="Learning rate.")
@click.option("--seed", type=int, default=TrainConfig.seed, show_default=True)
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint file: resumed from if it exists, rewritten atomically as training goes.")
@click.option("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every, show_default=True,
              help="Samples between checkpoints.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the result JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(board, algo, dataset, data_dir, model, samples, batch_size, lr, seed, checkpoint,
            checkpoint_every, out, as_json):
    """Train a network on a board, or on its simulated twin (the default, ultra96v2-sim).

    \b
    Examples:
      insitu train --samples 6000 --json
      insitu train --board ultra96v2-sim --dataset digits --model cnn
      insitu train --checkpoint run.ckpt.npz     # interrupt it, run again: it resumes
    """
    config = TrainConfig(board=board, algo=algo, dataset=dataset, data_dir=data_dir, model=model,
                         samples=samples, batch_size=batch_size, lr=lr, seed=seed,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    if out:
        check_writable(out, "--out")
    with progress(f"training on {board}", total=samples) as advance:
        result = train(config, advance)
    if as_json:
        emit_json(result)
    if out:
        try:
            atomic_write_json(out, result)
        except OSError as exc:
            raise InsituError(f"cannot write --out {out}: {exc.strerror}") from None
    if not as_json:
        report.print(f"[bold]{result['board']}[/] {result['algo']}: {result['samples']} samples "
                      f"({result['epochs']:.2f} epochs) in {result['seconds']:.1f} s, "
                      f"test accuracy [green]{result['accuracy']:.4f}[/]")

