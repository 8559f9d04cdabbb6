# Type stubs of the compiled module (python/src/*.rs). Results are JSON
# text that the typed layer (lmt/__init__.py) reads into objects.
import threading
from typing import Iterator, List, Optional, Tuple

__version__: str

class ModelError(RuntimeError): ...
class InputError(ValueError): ...

class Model:
    def __init__(
        self,
        spec: str,
        *,
        tokenizer: Optional[str] = None,
        chat_template: Optional[str] = None,
        threads: Optional[int] = None,
        engine: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None: ...
    @property
    def spec(self) -> str: ...
    @property
    def is_remote(self) -> bool: ...
    def describe(self) -> str: ...

class Events:
    def __iter__(self) -> Events: ...
    def __next__(self) -> str: ...
    def close(self) -> None: ...

class RowStream:
    def __iter__(self) -> RowStream: ...
    def __next__(self) -> str: ...
    def take_raised(self) -> Optional[BaseException]: ...
    def close(self) -> None: ...

class Template:
    def __init__(self, source: str, *, name: str = "<template>", path: Optional[str] = None, root: Optional[str] = None) -> None: ...
    @staticmethod
    def from_file(path: str, *, root: Optional[str] = None) -> Template: ...
    @property
    def name(self) -> str: ...
    @property
    def diagnostics_json(self) -> str: ...
    @property
    def report(self) -> str: ...
    @property
    def has_errors(self) -> bool: ...
    def inputs(self) -> List[Tuple[str, bool]]: ...
    def engine_problems_json(self, model: Model) -> str: ...
    def run(
        self,
        model: Model,
        inputs: str,
        *,
        seed: int = 0,
        temperature: float = 0.0,
        score_all: bool = False,
        html: bool = False,
        cancel: Optional[threading.Event] = None,
    ) -> Tuple[str, Optional[BaseException]]: ...
    def search(
        self,
        model: Model,
        inputs: str,
        kind: str,
        n: int,
        *,
        seed: int = 0,
        temperature: float = 0.0,
        score_all: bool = False,
        length_penalty: float = 0.0,
        cancel: Optional[threading.Event] = None,
    ) -> Tuple[str, Optional[BaseException]]: ...
    def iter_many(
        self,
        model: Model,
        rows: Iterator[str],
        defaults: str,
        *,
        parallel: int = 1,
        seed: int = 0,
        temperature: float = 0.0,
        score_all: bool = False,
        search: Optional[Tuple[str, int]] = None,
        length_penalty: float = 0.0,
    ) -> RowStream: ...
    def stream(
        self, model: Model, inputs: str, *, seed: int = 0, temperature: float = 0.0, score_all: bool = False
    ) -> Events: ...

def match_text(kind: str, value: str, text: str, tokenizer: str, json_open: bool = False) -> str: ...
