"""Jinja templates shipped in gpuprov/templates/, rendered with StrictUndefined (a missing value is an error, never
an empty string) and without autoescaping (the output is configuration, not HTML: values are checked before)."""

from __future__ import annotations

from functools import cache


@cache
def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("gpuprov", "templates"), undefined=jinja2.StrictUndefined,
                              autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render_template(name: str, **values) -> str:
    """The template `name` rendered with `values`."""
    return _environment().get_template(name).render(**values)
