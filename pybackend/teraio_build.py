"""PEP 517 backend for teraio: setuptools' own, plus the running interpreter's site-packages.

The native extension must be compiled against the torch the user already installed. pip's build
isolation hides it; appending (not prepending) the real site-packages makes `import torch` work
while the isolated setuptools still wins.
"""
import site
import sys
import sysconfig

for _p in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]:
    if _p not in sys.path:
        sys.path.append(_p)

from setuptools import build_meta as _meta  # noqa: E402

get_requires_for_build_wheel = _meta.get_requires_for_build_wheel
get_requires_for_build_sdist = _meta.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
get_requires_for_build_editable = getattr(_meta, "get_requires_for_build_editable", None)
build_editable = getattr(_meta, "build_editable", None)
