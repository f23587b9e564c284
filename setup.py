"""Maps the top-level rooms (engine/, constrain/, ...) to `tamis.<room>` packages.

The mapping is computed here rather than listed in pyproject.toml so that a new
subpackage inside a room is picked up without editing packaging metadata, and
no generic top-level name (`engine`, `server`) ever lands in site-packages.
"""
from setuptools import find_packages, setup

ROOMS = ("engine", "constrain", "quant", "kernels", "server")

packages = find_packages(include=["tamis", "tamis.*"])
package_dir = {"tamis": "tamis"}
for room in ROOMS:
    package_dir[f"tamis.{room}"] = room
    packages.append(f"tamis.{room}")
    packages += [f"tamis.{p}" for p in find_packages(include=[f"{room}.*"])]

setup(packages=packages, package_dir=package_dir,
      package_data={"": ["*.json", "*.lark", "*.jinja"]})
