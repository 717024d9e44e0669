"""delta-ray: the reference tokenizer's exact IDs, incrementally and in parallel on Ray."""
from delta_ray.admission import Admission as Admission
from delta_ray.loading import load_tokenizer as load_tokenizer
from delta_ray.session_store import SessionNotFound as SessionNotFound
from delta_ray.tokenizer import DeltaTokenizer as DeltaTokenizer

__all__ = ["Admission", "DeltaTokenizer", "SessionNotFound", "load_tokenizer"]
