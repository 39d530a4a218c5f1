"""Words of a text, below everything that reads them: a text's language, its
terms as BM25 and the evidence count them (stemmed, stop words out), and how
common a word is. Ingest, the index and the question's evidence all import
from here, and this package imports nothing of the project's."""
