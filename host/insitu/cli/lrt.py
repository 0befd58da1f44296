"""`insitu lrt`: low-rank training experiments (adaptation, transfer comparison, benchmark)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from insitu.cli.options import option, resolve_config, run_folder, run_options

from insitu.cli.output import (emit_json, per_run_path, progress, report, usage_errors,
                               write_json)
from insitu.errors import UsageError
from insitu.checks import check_int
from insitu.io import check_writable
from insitu.lrt import ENVS, SCHEMES


@click.group("lrt")
def command():
    """Low-rank training (LRT/SKS) for weights in non-volatile memory.

    \b
    Examples:
      insitu lrt adapt --env shift --scheme lrt-maxnorm --samples 10000 --json
      insitu lrt adapt --env analog --scheme all --samples 10000 --plot analog.png
      insitu lrt adapt --env shift --dataset folder:my_images --samples 2000
      insitu lrt adapt --env control --model mlp --dataset csv:table.csv --samples 2000
      insitu lrt transfer --json
      insitu lrt bench --json
    """


#: The options of `insitu lrt adapt` that set LRTConfig's fields, for its errors.
_ADAPT_OPTIONS = {"lr": "--lr", "bias_lr": "--bias-lr", "rank": "--rank", "conv_batch": "--conv-batch",
                  "dense_batch": "--dense-batch", "rho_min": "--rho-min", "kappa_th": "--kappa-th"}


def _seed_list(text: str) -> tuple[int, ...]:
    """``--seeds``: comma-separated seeds (``0,1,2``); one integer is that one seed."""
    try:
        seeds = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--seeds takes comma-separated integers (0,1,2), got {text!r}") from None
    for seed in seeds:
        check_int("--seeds", seed, low=0)
    if len(set(seeds)) < len(seeds):
        raise UsageError(f"--seeds lists a seed twice: {text!r}")
    return seeds


@command.command("adapt")
@click.option("--env", type=click.Choice(ENVS), default=None,
              help="Environment: control, distribution shift, analog or digital weight drift.")
@click.option("--scheme", type=click.Choice([*SCHEMES, "all"]),
              default="lrt-maxnorm", show_default=True, help="Online training scheme (all: the five).")
@click.option("--samples", type=int, default=10_000, show_default=True, help="Online samples.")
@click.option("--seed", type=int, default=0, show_default=True)
@option("--model", "arch", aliases=("--arch",), type=click.Choice(["cnn", "mlp"]), default="cnn",
        show_default=True,
        help="cnn: the paper's four-conv, two-dense network (grey images, sides >= 8); mlp: a dense "
             "network (any images, or feature vectors).")
@click.option("--dataset", default="fashion-mnist", show_default=True,
              help="A built-in dataset (see `insitu data list`) or your files: folder:DIR, npz:FILE, "
                   "csv:FILE. RGB images are taken grey; feature vectors need --model mlp.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the dataset's IDX files (MNIST needs one).")
@click.option("--lr", type=float, default=0.01, show_default=True, help="Weight learning rate η.")
@click.option("--bias-lr", type=float, default=0.01, show_default=True)
@click.option("--rank", type=int, default=4, show_default=True)
@click.option("--conv-batch", type=int, default=10, show_default=True, help="Pseudo-batch B of convolutions.")
@click.option("--dense-batch", type=int, default=100, show_default=True, help="Pseudo-batch B of dense layers.")
@click.option("--rho-min", type=float, default=0.01, show_default=True, help="Minimum update density.")
@click.option("--kappa-th", type=float, default=100.0, show_default=True,
              help="Skip pairs whose approximate condition number exceeds this (0: never skip).")
@click.option("--segment", type=int, default=10_000, show_default=True,
              help="Samples per distribution-shift segment.")
@click.option("--offline-samples", type=int, default=20_000, show_default=True,
              help="Offline pre-training samples per epoch (20 epochs, each on fresh augmentations "
                   "of the offline images; the pre-trained model is cached; the first run with "
                   "these settings pre-trains, about 15 min on two cores). 0: no pre-training, "
                   "the network learns from scratch online (the paper's figure 6).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write the figure (PNG).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the result JSON.")
@click.option("--counts", type=click.Path(dir_okay=False), default=None,
              help="Write per-cell write counts (.npz); with --scheme all, one file per scheme.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint (.npz): resumed from if it exists, rewritten atomically as the run "
                   "goes; with --scheme all, one file per scheme.")
@click.option("--checkpoint-every", type=int, default=1000, show_default=True,
              help="Samples between checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@run_options
@click.pass_context
def adapt(ctx, **_):
    """Pre-train offline, deploy, and adapt online (the LRT paper's figure 2).

    Options also come from a --config TOML file and KEY=VALUE arguments; --run-dir keeps the run
    (config, result, curve, checkpoints, write counts, plot) for `insitu runs compare`.
    """
    from insitu.lrt.adapt import check_adapt, plot_adapt, run_adapt
    from insitu.lrt.online import OnlineData
    from insitu.lrt.schemes import LRTConfig
    from insitu.runs import summary_row

    resolve_config(ctx)
    p = ctx.params
    (env, scheme, samples, seed, arch, dataset, data_dir, lr, bias_lr, rank, conv_batch, dense_batch,
     rho_min, kappa_th, segment, offline_samples, plot, out, counts, checkpoint, checkpoint_every,
     as_json) = (p[k] for k in (
        "env", "scheme", "samples", "seed", "arch", "dataset", "data_dir", "lr", "bias_lr", "rank",
        "conv_batch", "dense_batch", "rho_min", "kappa_th", "segment", "offline_samples", "plot", "out",
        "counts", "checkpoint", "checkpoint_every", "as_json"))
    if env is None:
        raise UsageError("give --env (control, shift, analog or digital), on the command line, in "
                         "--config or as env=...")
    folder = run_folder(ctx, "insitu lrt adapt")
    if folder is not None:
        checkpoint = checkpoint or str(folder.checkpoint)
        counts = counts or str(folder.file("counts.npz"))
        plot = plot or str(folder.file("plot.png"))

    if kappa_th < 0:
        raise UsageError(f"--kappa-th must be >= 0 (0 never skips), got {kappa_th}")
    config = LRTConfig(lr=lr, bias_lr=bias_lr, rank=rank, conv_batch=conv_batch,
                       dense_batch=dense_batch, rho_min=rho_min, kappa_th=kappa_th or None)
    usage_errors(check_adapt, arch, OnlineData(dataset, data_dir, seed=seed), config, names=_ADAPT_OPTIONS)
    for name, value in (("--samples", samples), ("--segment", segment),
                        ("--checkpoint-every", checkpoint_every)):
        check_int(name, value)
    check_int("--offline-samples", offline_samples, low=0)
    for path, what in ((plot, "--plot"), (out, "--out"), (counts, "--counts"),
                       (checkpoint, "--checkpoint")):
        if path:
            check_writable(path, what, plot=what == "--plot")
    schemes = list(SCHEMES) if scheme == "all" else [scheme]

    def per_scheme(path, name):
        return per_run_path(path, name, several=len(schemes) > 1)

    if folder is not None and folder.complete:
        payload = folder.already_complete()
        results = payload["runs"] if "runs" in payload else [payload]
        if p["plot"]:                         # a figure asked now: drawn from the kept results
            plot_adapt(results, p["plot"])
    else:
        results = []
        with (folder.running() if folder else contextlib.nullcontext()):
            for name in schemes:
                with progress(f"{name} in {env}", total=samples) as advance:
                    results.append(usage_errors(run_adapt, env, name, samples, seed=seed, arch=arch,
                                                dataset=dataset, data_dir=data_dir, config=config,
                                                segment=segment, offline_samples=offline_samples,
                                                counts_out=per_scheme(counts, name),
                                                checkpoint=per_scheme(checkpoint, name),
                                                checkpoint_every=checkpoint_every, advance=advance))
                    counts_file = per_scheme(counts, name)
                    if counts_file:         # where `insitu writes report` finds the per-cell counts
                        results[-1]["counts_file"] = str(Path(counts_file).resolve())
            payload = _adapt_payload(results, env, samples, seed)
            rows = [summary_row(r["scheme"], r) for r in results]
            if folder:
                folder.finish(payload, rows)
        if plot:             # drawn once the result is kept: a figure that fails loses nothing
            plot_adapt(results, plot)
    if out:
        write_json(out, payload, "--out")
    if as_json:
        emit_json(payload)
    else:
        for r in results:
            report.print(f"{r['env']:8s} {r['scheme']:12s} online accuracy (EMA) "
                         f"[green]{r['online_accuracy']:.4f}[/]  max writes/cell "
                         f"{r['max_writes_per_cell']:>9d}  total writes {r['total_writes']:>11d}  "
                         f"({r['samples']} samples, {r['seconds']:.0f} s)")


def _adapt_payload(results: list[dict], env: str, samples: int, seed: int) -> dict:
    """One scheme's result, or the schemes' summary and results."""
    if len(results) == 1:
        return results[0]
    return {"env": env, "samples": samples, "seed": seed,
            "summary": [{k: r[k] for k in ("scheme", "online_accuracy", "max_writes_per_cell",
                                            "total_writes", "max_update_ops_per_cell")}
                        for r in results],
            "runs": results}


@command.command("transfer")
@click.option("--ranks", default="1,2,4,8", show_default=True, help="Comma-separated ranks.")
@click.option("--lrs", default="0.003,0.01,0.03,0.1,0.3", show_default=True,
              help="Comma-separated learning rates.")
@click.option("--seeds", default="0,1,2", show_default=True,
              help="Comma-separated seeds, one run each (one integer: that one seed). Until this "
                   "release --seeds was a count: --seeds 3 is now --seeds 0,1,2.")
@click.option("--samples", type=int, default=None, help="Online samples per run (default: the module's).")
@click.option("--dataset", default="fashion-mnist", show_default=True,
              help="A built-in dataset or your files (folder:DIR, npz:FILE, csv:FILE); images are "
                   "taken grey by a CNN, feature vectors by a dense network of the same width.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the dataset's IDX files (MNIST needs one).")
@click.option("--pretrain-samples", type=int, default=None,
              help="Samples per pre-training epoch of the feature CNN (default: the module's).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the result JSON.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def transfer(ranks, lrs, seeds, samples, dataset, data_dir, pretrain_samples, out, as_json):
    """Recover a damaged final layer with SGD, UORO, biased SVD and LRT (the paper's table 1)."""
    from insitu.lrt.transfer import format_table, progress_total, run_transfer

    try:
        rank_list = tuple(int(v) for v in ranks.split(","))
        lr_list = tuple(float(v) for v in lrs.split(","))
    except ValueError:
        raise UsageError(f"--ranks and --lrs take comma-separated numbers, got {ranks!r} and {lrs!r}") from None
    seed_list = _seed_list(seeds)
    if out:
        check_writable(out, "--out")
    kwargs = {} if samples is None else {"samples": samples}
    if pretrain_samples is not None:
        kwargs["pretrain_samples"] = pretrain_samples
    total = progress_total(seeds=seed_list, **kwargs)
    with progress("transfer runs", total=total) as advance:
        result = usage_errors(run_transfer, ranks=rank_list, lrs=lr_list, seeds=seed_list,
                        dataset=dataset, data_dir=data_dir, progress=advance, **kwargs)
    if out:
        write_json(out, result, "--out")
    if as_json:
        emit_json(result)
    else:
        click.echo(format_table(result))


@command.command("bench")
@click.option("--sizes", default="256,512,1024,2048", show_default=True,
              help="Comma-separated n (n_out = n_in).")
@click.option("--rank", type=int, default=4, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(sizes, rank, as_json):
    """Per-sample cost of KroneckerSum.add vs dense rank-1 accumulation, and their memory."""
    from insitu.lrt.bench import format_bench, run_bench

    try:
        size_list = tuple(int(v) for v in sizes.split(","))
    except ValueError:
        raise UsageError(f"--sizes takes comma-separated integers, got {sizes!r}") from None
    result = usage_errors(run_bench, sizes=size_list, rank=rank)
    if as_json:
        emit_json(result)
    else:
        click.echo(format_bench(result))
