"""Where recipes come from: the shipped folder, yours in the config
folder, and any folder you name (native recipes, eugr's and sparkrun's
formats alike); finding one by name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sparktop.errors import ConfigError, SparktopError
from sparktop.launch.community import parse_community
from sparktop.launch.recipe import Recipe, parse_native
from sparktop.settings import config_dir, shipped_recipes_dir
from sparktop.yamlfile import line_of, load_file


def load_recipe_file(path: str | Path) -> Recipe:
    path = Path(path)
    doc = load_file(path)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), line_of(doc, 0), None, "a recipe must be a YAML mapping")
    community = parse_community(doc, path)
    if community is not None:
        return community
    return parse_native(doc, path)


def recipe_dirs(extra: Sequence[str | Path] | None = None) -> list[Path]:
    """Where recipes are looked for, later folders winning on a name clash."""
    dirs = [shipped_recipes_dir(), config_dir() / "recipes"]
    dirs += [Path(d).expanduser() for d in (extra or [])]
    return dirs


def discover(extra: Sequence[str | Path] | None = None, strict: bool = False) -> tuple[dict[str, Recipe], list[str]]:
    """All recipes by id, and the one-line errors of files that failed to load."""
    found: dict[str, Recipe] = {}
    errors: list[str] = []
    for folder in recipe_dirs(extra):
        if not folder.is_dir():
            if extra and folder in [Path(d).expanduser() for d in extra]:
                errors.append(f"{folder}: no such folder")
            continue
        for path in sorted(list(folder.glob("*.yaml")) + list(folder.glob("*.yml"))):
            try:
                recipe = load_recipe_file(path)
            except ConfigError as exc:
                if strict:
                    raise
                errors.append(str(exc))
                continue
            found[recipe.id] = recipe
    return found, errors


def find_recipe(ref: str, extra: Sequence[str | Path] | None = None) -> Recipe:
    """A recipe by id, or by the path of a file."""
    candidate = Path(ref).expanduser()
    if ref.endswith((".yaml", ".yml")) or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError(str(candidate), None, None, "no such recipe file")
        return load_recipe_file(candidate)
    recipes, errors = discover(extra)
    if ref in recipes:
        return recipes[ref]
    by_name = [r for r in recipes.values() if r.name == ref]
    if len(by_name) == 1:
        return by_name[0]
    import difflib

    close = difflib.get_close_matches(ref, list(recipes), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(recipes)) or 'none'}"
    broken = [e for e in errors if Path(e.split(":")[0]).stem == ref]
    if broken:
        raise ConfigError(broken[0].split(":")[0], None, None, broken[0].split(": ", 1)[-1])
    raise ConfigError("recipes", None, None, f"no recipe named {ref!r}{hint}")


def runtime_recipes(recipe: Recipe, runtimes: str | None, extra: list | None = None) -> dict[str, Recipe]:
    """`--runtimes vllm,sglang,llama-cpp`: for each, the recipe that serves this recipe's model in it (this one
    for its own runtime; another by the same model card, or the same model, for the others)."""
    from sparktop.launch.runtimes import UnknownRuntime, runtime_id

    if not runtimes:
        return {recipe.runtime: recipe}
    card = recipe.twin_card()
    wanted = card.name if card is not None else recipe.model
    known: dict[str, Recipe] | None = None
    out: dict[str, Recipe] = {}
    for name in (n.strip() for n in runtimes.split(",") if n.strip()):
        try:
            rid = runtime_id(name)
        except UnknownRuntime as exc:
            raise SparktopError(f"--runtimes {name}: {exc}") from None
        if rid == recipe.runtime:
            out[rid] = recipe
            continue
        if known is None:
            known = discover(extra)[0]
        same = sorted((r for r in known.values() if r.runtime == rid and
                       _serves(r, wanted, recipe.model, recipe.served_name)), key=lambda r: r.id)
        if not same:
            others = sorted(r.id for r in known.values() if _serves(r, wanted, recipe.model, recipe.served_name))
            raise SparktopError(f"--runtimes {name}: no {rid} recipe serves {wanted} (its recipes: "
                                f"{', '.join(others) or 'none'}); write one with `runtime: {rid}`")
        out[rid] = same[0]
    return out


def _serves(r: Recipe, card: str, model: str, served: str | None = None) -> bool:
    """One model, whatever the runtime: the same card, the same model id, or the same served name."""
    mine = r.twin_card()
    return (mine is not None and mine.name == card) or r.model == model or (served is not None
                                                                          and r.served_name == served)
