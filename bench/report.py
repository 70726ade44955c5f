"""Write the benchmark's numbers as JSON, a markdown table and a PNG bar chart."""

from __future__ import annotations

import json
import os
import platform


def machine() -> dict:
    """What the numbers were measured on."""
    import apache_beam
    import psutil
    import tensorflow as tf

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "tensorflow": tf.__version__, "apache_beam": apache_beam.__version__}


def _get(*keys):
    """A getter of ``results[k1][k2]...``, None when a section was skipped."""
    def get(results: dict):
        value = results
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value
    return get


# name -> (goal as shown, getter, test of the measured value)
TARGETS = {
    "converter, JPEG pass-through (300-500 px), vs plain loop": (
        ">= 2.1x", _get("convert", "ratio_ours_over_plain_per_image"), lambda v: v >= 2.1),
    "converter, --max-side 256 on 1200-1600 px JPEGs, vs plain loop": (
        ">= 4x", _get("convert_downsize", "ratio_ours_over_plain_per_image"), lambda v: v >= 4),
    "converter, PNG (300-500 px) to JPEG, vs plain loop": (
        ">= 1.8x", _get("convert_png", "ratio_ours_over_plain_per_image"), lambda v: v >= 1.8),
    "converter start-up (s)": ("< 5 s", _get("convert", "tools", "ours", "startup_s"), lambda v: v < 5),
    "converter peak RSS growth per 1000 images (MB)": (
        "<= 10 MB", _get("convert", "tools", "ours", "peak_rss_mb_per_1000_more_images"), lambda v: v <= 10),
    "train preset vs in-memory decode bound (300-500 px)": (
        ">= 1.0x", _get("read", "ratios_warm", "train_over_decode_bound"), lambda v: v >= 1.0),
    "eval preset vs in-memory decode bound (300-500 px)": (
        ">= 0.95x", _get("read", "ratios_warm", "eval_over_decode_bound"), lambda v: v >= 0.95),
    "train preset vs image_dataset_from_directory (1200-1600 px)": (
        ">= 1.3x", _get("read_large_photos", "ratios", "train_over_image_dataset_from_directory"), lambda v: v >= 1.3),
    "train preset vs ImageDataGenerator": (
        ">= 20x", _get("read", "ratios_warm", "train_over_image_data_generator"), lambda v: v >= 20),
    "file cache / shard bytes": ("<= 1.1x", _get("read", "caches", "file_cache_over_shards"), lambda v: v <= 1.1),
}


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Measured {results['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, "
             f"Python {m['python']}, TF {m['tensorflow']}, Beam {m['apache_beam']}; "
             f"{results['images']} photos (300-500 px), one run, medians of {results['convert']['rounds']} rounds.", "",
             "| target | goal | measured | met |", "|---|---|---|---|"]
    if results.get("reruns"):
        lines[1:1] = ["", "Sections measured again on their own, with nothing else running: "
                      + "; ".join(results["reruns"]) + "."]
    for name, (goal, get, met) in TARGETS.items():
        value = get(results)
        if value is None:
            lines.append(f"| {name} | {goal} | not measured in this run | |")
        else:
            lines.append(f"| {name} | {goal} | {value:.3f} | {'yes' if met(value) else 'no'} |")
    convert = results["convert"]["tools"]
    lines += ["", "| converter | images/s (per image) | CPU ms per image | start-up s | end-to-end images/s "
              "| peak RSS MB (small / large) |", "|---|---|---|---|---|---|"]
    for tool, r in convert.items():
        cpu = f"{r['cpu_per_image_ms']:.3f}" if "cpu_per_image_ms" in r else ""
        lines.append(f"| {tool} | {r['images_per_s']:.0f} | {cpu} | {r['startup_s']:.1f} | {r['end_to_end_images_per_s']:.0f} "
                     f"| {r['peak_rss_mb']['small']:.0f} / {r['peak_rss_mb']['large']:.0f} |")
    bound = results["convert"]["hardware_bound_images_per_s"]
    lines.append(f"| read + validate only (bound) | {bound['all_cores']:.0f} all cores, {bound['one_core']:.0f} one core "
                 "| | | | |")
    if "ratio_ceiling_all_cores" in results["convert"]:
        lines += ["", f"CPU ceiling of the converter ratio on {m['cores']} cores (plain loop's CPU per image over "
                  f"ours, times the cores): {results['convert']['ratio_ceiling_all_cores']:.2f}x."]
    lines += ["", f"| reader (224 px, batch {results['read'].get('batch', 64)}) | warm images/s (min-max) "
              "| cold images/s (min-max) | warm CPU ms per image |", "|---|---|---|---|"]
    for name, r in results["read"]["pipelines"].items():
        cpu = f"{r['warm']['cpu_ms_per_image']:.2f}" if "cpu_ms_per_image" in r["warm"] else ""
        lines.append(f"| {name} | {r['warm']['images_per_s']:.0f} ({r['warm']['min']:.0f}-{r['warm']['max']:.0f}) "
                     f"| {r['cold']['images_per_s']:.0f} ({r['cold']['min']:.0f}-{r['cold']['max']:.0f}) | {cpu} |")
    context = results["read"].get("bound_context_warm")
    if context:
        lines += ["", "Against the in-memory decode bound (warm), per round: train preset "
                  f"{context['train_over_decode_bound_paired']:.3f}x, eval preset "
                  f"{context['eval_over_decode_bound_paired']:.3f}x (medians of each round's ratio); in CPU time per "
                  f"image, the bound's over the preset's: train {context['train_cpu_efficiency_over_decode_bound']:.3f}x, "
                  f"eval {context['eval_cpu_efficiency_over_decode_bound']:.3f}x."]
    for key, title in (("convert_downsize", "--max-side 256 on 1200-1600 px JPEGs"),
                       ("convert_png", "PNG photos (300-500 px) to JPEG")):
        section = results.get(key)
        if not section:
            continue
        lines += ["", f"Converter, {title} ({section['sizes']['small']} + {section['sizes']['large']} images, "
                  f"{section['rounds']} rounds): {section['ratio_ours_over_plain_per_image']:.2f}x the plain loop per "
                  f"image; CPU ceiling {section['ratio_ceiling_all_cores']:.2f}x.", "",
                  "| converter | images/s (per image) | CPU ms per image | start-up s | largest process peak RSS MB "
                  "(small / large) |", "|---|---|---|---|---|"]
        for tool, r in section["tools"].items():
            peak = r.get("largest_process_peak_rss_mb", {"small": 0, "large": 0})
            lines.append(f"| {tool} | {r['images_per_s']:.0f} | {r['cpu_per_image_ms']:.2f} | {r['startup_s']:.1f} "
                         f"| {peak['small']:.0f} / {peak['large']:.0f} |")
        bound = section["hardware_bound_images_per_s"]
        lines.append(f"| per-image work only (bound) | {bound['all_cores']:.0f} all cores, {bound['one_core']:.0f} one "
                     "core | | | |")
    workflow = results.get("downsize_workflow")
    if workflow:
        lines += ["", f"Downsizing workflow ({workflow['images']} photos of 1200-1600 px): converting once with "
                  f"`--max-side 256` took {workflow['convert_seconds']:.1f} s; then the training preset (224 px) reads "
                  f"the downsized shards at {workflow['pipelines']['ours_train']['images_per_s']:.0f} images/s against "
                  f"{workflow['pipelines']['image_dataset_from_directory']['images_per_s']:.0f} for "
                  f"`image_dataset_from_directory` on the original photos "
                  f"({workflow['train_over_image_dataset_from_directory']:.2f}x); the conversion has paid for itself "
                  f"after {workflow['break_even_epochs']:.2f} epochs."]
    large = results.get("read_large_photos")
    if large:
        lines += ["", f"Large photos ({large['images']} photos, {large['sides'][0]}-{large['sides'][1]} px, warm): "
                  f"train preset {large['ratios']['train_over_image_dataset_from_directory']:.2f}x and eval preset "
                  f"{large['ratios']['eval_over_image_dataset_from_directory']:.2f}x `image_dataset_from_directory`.",
                  "", "| reader, large photos | warm images/s (min-max) |", "|---|---|"]
        for name, r in large["pipelines"].items():
            lines.append(f"| {name} | {r['images_per_s']:.0f} ({r['min']:.0f}-{r['max']:.0f}) |")
    caches = results["read"]["caches"]
    lines += ["", f"Caches: file cache {caches['file_cache_over_shards']:.3f}x the shards' bytes; memory cache "
              f"resident growth {caches['memory_cache_over_shards']:.2f}x."]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    convert = results["convert"]["tools"]
    bound = results["convert"]["hardware_bound_images_per_s"]
    names = ["plain loop", "ours", "bound (all cores)"]
    values = [convert["plain_loop"]["images_per_s"], convert["ours"]["images_per_s"], bound["all_cores"]]
    left.bar(names, values, color=["#999999", "#1f77b4", "#cccccc"])
    for index, value in enumerate(values):
        left.text(index, value, f"{value:.0f}", ha="center", va="bottom", fontsize=9)
    left.set_title("converter: images/s (per image, start-up removed)")
    pipelines = results["read"]["pipelines"]
    names = list(pipelines)
    warm = [pipelines[n]["warm"]["images_per_s"] for n in names]
    cold = [pipelines[n]["cold"]["images_per_s"] for n in names]
    positions = range(len(names))
    right.barh([p + 0.2 for p in positions], warm, height=0.4, label="warm page cache")
    right.barh([p - 0.2 for p in positions], cold, height=0.4, label="cold (evicted)")
    for position, value in zip(positions, warm):
        right.text(value, position + 0.2, f" {value:.0f}", va="center", fontsize=8)
    right.set_yticks(list(positions), names)
    right.set_xlim(0, max(warm + cold) * 1.25)
    right.set_title(f"reader: images/s at 224 px, batch {results['read'].get('batch', 64)}")
    right.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict, folder: str) -> dict:
    os.makedirs(folder, exist_ok=True)
    paths = {"json": os.path.join(folder, "results.json"), "markdown": os.path.join(folder, "results.md"),
             "chart": os.path.join(folder, "results.png")}
    with open(paths["json"], "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    with open(paths["markdown"], "w", encoding="utf-8") as handle:
        handle.write(markdown(results))
    chart(results, paths["chart"])
    return paths


if __name__ == "__main__":
    import sys

    # Re-render the markdown and the chart from a results.json: python -m bench.report bench/results/results.json
    with open(sys.argv[1], encoding="utf-8") as handle:
        write(json.load(handle), os.path.dirname(os.path.abspath(sys.argv[1])))
