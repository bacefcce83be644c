"""The vetted import-name -> distribution table: the only names installed without being declared.

A name missing here is never guessed (typosquats live on guessed names); the user declares it.
"""

PYTHON: dict[str, str] = {
    "attr": "attrs", "attrs": "attrs", "bs4": "beautifulsoup4", "certifi": "certifi", "click": "click",
    "dateutil": "python-dateutil", "django": "Django", "fastapi": "fastapi", "flask": "Flask", "httpx": "httpx",
    "idna": "idna", "jinja2": "Jinja2", "matplotlib": "matplotlib", "numpy": "numpy", "pandas": "pandas",
    "PIL": "Pillow", "pydantic": "pydantic", "pytest": "pytest", "pytz": "pytz", "requests": "requests",
    "rich": "rich", "scipy": "scipy", "six": "six", "sklearn": "scikit-learn", "sqlalchemy": "SQLAlchemy",
    "tabulate": "tabulate", "toml": "toml", "tqdm": "tqdm", "urllib3": "urllib3", "uvicorn": "uvicorn",
    "yaml": "PyYAML",
}

NODE: frozenset[str] = frozenset({
    "axios", "chalk", "commander", "dayjs", "express", "lodash", "moment", "ms", "react", "react-dom", "uuid", "ws",
})
