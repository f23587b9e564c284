"""Maps the top-level subpackage folders (engine/, constrain/, ...) to `tamis.<name>`.

The mapping is computed here rather than listed in pyproject.toml so that a new
subpackage inside one of them is picked up without editing packaging metadata, and
no generic top-level name (`engine`, `server`) ever lands in site-packages.

Editable installs use setuptools' strict mode: a link tree under
build/__editable__.tamis-*/ holding only `tamis`, put on sys.path by a .pth file. The
default mode installs an import hook that runs after Python's path search, so a script
run beside a clone folder named `tamis/` got that folder (an empty namespace package)
instead of the install. New modules still import without reinstalling: in a checkout,
`tamis/__init__.py` finds the subpackages in the folders beside it.
"""
from setuptools import find_packages, setup

SUBPACKAGES = ("engine", "constrain", "quant", "kernels", "server")

packages = find_packages(include=["tamis", "tamis.*"])
package_dir = {"tamis": "tamis"}
for name in SUBPACKAGES:
    package_dir[f"tamis.{name}"] = name
    packages.append(f"tamis.{name}")
    packages += [f"tamis.{p}" for p in find_packages(include=[f"{name}.*"])]

setup(packages=packages, package_dir=package_dir,
      package_data={"": ["*.json", "*.lark", "*.jinja"]},
      options={"editable_wheel": {"mode": "strict"}})
