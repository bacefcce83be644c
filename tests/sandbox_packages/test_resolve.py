"""Resolution: imports to vetted distributions; declarations first, plus what the code imports that they lack
(unless codeyard.toml turns that off); unknown names are reported."""

from pathlib import Path

import pytest

from sandbox.packages.resolve import Resolution, is_package_name, resolve_node, resolve_python


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_imports_map_through_the_vetted_table(tmp_path):
    write(tmp_path, {"main.py": "import os, json\nimport requests\nfrom PIL import Image\nimport yaml.loader\n"
                                "from . import sibling\nfrom .x import y\nimport helpers\nfrom lib.util import f\n",
                     "helpers.py": "import numpy as np\n", "lib/util.py": "", "broken.py": "def (:\n"})
    assert resolve_python(tmp_path) == Resolution(("Pillow", "PyYAML", "numpy", "requests"), (), False, (
        ("PIL", "Pillow"), ("yaml", "PyYAML"), ("numpy", "numpy"), ("requests", "requests")))


def test_unknown_names_are_reported_not_guessed(tmp_path):
    write(tmp_path, {"main.py": "import reqeusts\nimport six\nimport foo_bar\n"})
    assert resolve_python(tmp_path) == Resolution(("six",), ("foo_bar", "reqeusts"), False, (("six", "six"),))


def test_requirements_txt_first_then_imports_it_lacks(tmp_path):
    write(tmp_path, {"main.py": "import unknownthing\nimport numpy, six, idna\n",
                     "requirements.txt": "# pinned\nsix==1.16.0\nidna  # ok\n", "pyproject.toml": "[project]\ndependencies = ['flask']\n"})
    assert resolve_python(tmp_path) == Resolution(("six==1.16.0", "idna", "numpy"), (), True, (("numpy", "numpy"),),
                                                  unchecked=("unknownthing",))


def test_pyproject_dependencies_when_no_requirements_txt(tmp_path):
    write(tmp_path, {"main.py": "import x\nimport flask\n", "pyproject.toml": "[project]\ndependencies = ['flask>=2']\n"})
    assert resolve_python(tmp_path) == Resolution(("flask>=2",), (), True, unchecked=("x",))


def test_codeyard_toml_can_turn_auto_install_off(tmp_path):
    write(tmp_path, {"main.py": "import bs4\n", "requirements.txt": "six\n", "codeyard.toml": "[packages]\nauto_install = false\n"})
    assert resolve_python(tmp_path) == Resolution(("six",), (), True, (("bs4", "beautifulsoup4"),), False)
    write(tmp_path, {"codeyard.toml": "[packages]\nauto_install = 'no'\n"})
    with pytest.raises(ValueError, match="packages.auto_install must be true or false"):
        resolve_python(tmp_path)


@pytest.mark.parametrize("line", ["--index-url=https://evil.example/simple", "-e .", "six @ https://evil.example/six.whl",
                                  "not a requirement!"])
def test_bad_requirement_lines_are_refused(tmp_path, line):
    write(tmp_path, {"requirements.txt": f"{line}\n"})
    with pytest.raises(ValueError, match="requirements.txt"):
        resolve_python(tmp_path)


def test_node_bare_imports(tmp_path):
    write(tmp_path, {"index.js": "const fs = require('fs');\nconst _ = require('lodash/fp');\nimport x from './x.js';\n"
                                 "import p from 'node:path';\nimport express from \"express\";\nconst q = require('leftpadz');\n"})
    assert resolve_node(tmp_path) == Resolution(("express", "lodash"), ("leftpadz",), False,
                                                (("express", "express"), ("lodash", "lodash")))


def test_package_json_first_then_requires_it_lacks(tmp_path):
    write(tmp_path, {"index.js": "require('nope'); require('left-pad'); require('lodash')\n",
                     "package.json": '{"dependencies": {"left-pad": "^1.3.0"}}'})
    assert resolve_node(tmp_path) == Resolution(("left-pad@^1.3.0", "lodash"), ("nope",), True, (("lodash", "lodash"),))


@pytest.mark.parametrize("name,ok", [("six", True), ("python-dateutil", True), ("zope.interface", True),
                                     ("--index-url=https://x", False), ("git+https://x/y", False), ("../pkg", False),
                                     ("six==1.0", False), ("", False), ("a b", False)])
def test_package_names(name, ok):
    assert is_package_name(name) is ok
