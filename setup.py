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

The constraint layer's compiled core (constrain/_native*.c) is an optional extension: where
no C compiler works the install still succeeds and constrain/native.py falls back to numpy.
An editable install builds it in place (constrain/_native.*.so), where `tamis.constrain`
is found in a checkout.
"""
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SUBPACKAGES = ("engine", "constrain", "quant", "kernels", "server")

packages = find_packages(include=["tamis", "tamis.*"])
package_dir = {"tamis": "tamis"}
for name in SUBPACKAGES:
    package_dir[f"tamis.{name}"] = name
    packages.append(f"tamis.{name}")
    packages += [f"tamis.{p}" for p in find_packages(include=[f"{name}.*"])]


class OptionalBuildExt(build_ext):
    """Leaves an optional extension that failed to build out of the outputs: an editable
    install would otherwise link the missing file and fail."""

    def build_extensions(self):
        built = []
        for ext in self.extensions:
            try:
                self.build_extension(ext)
                built.append(ext)
            except Exception as error:
                if not ext.optional:
                    raise
                self.warn(f"{ext.name} not built ({error}); its Python fallback is used")
        self.extensions = built


native = Extension("tamis.constrain._native", optional=True,
                   sources=[f"constrain/_native{part}.c" for part in ("", "_rows", "_product", "_trie", "_build", "_earley")],
                   depends=["constrain/_native_common.h"])

setup(packages=packages, package_dir=package_dir,
      package_data={"": ["*.json", "*.lark", "*.jinja"]},
      exclude_package_data={"": ["*.c", "*.h"]},  # the extension's source: not in the wheel
      ext_modules=[native], cmdclass={"build_ext": OptionalBuildExt},
      options={"editable_wheel": {"mode": "strict"}})
