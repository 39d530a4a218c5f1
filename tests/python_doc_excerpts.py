"""Excerpts of the Python 3.11 docs' reStructuredText sources, as the bench
indexes them: what the markup reader and the evidence tests read."""

FUNCTOOLS = """\
:mod:`functools` --- Higher-order functions and operations on callable objects
==============================================================================

.. module:: functools
   :synopsis: Higher-order functions and operations on callable objects.

.. decorator:: lru_cache(user_function)
               lru_cache(maxsize=128, typed=False)

   Decorator to wrap a function with a memoizing callable that saves up to the
   *maxsize* most recent calls.  It can save time when an expensive or I/O bound
   function is periodically called with the same arguments.

   If *maxsize* is set to ``None``, the LRU feature is disabled and the cache can
   grow without bound.

   Example of an LRU cache for static web content::

       @lru_cache(maxsize=32)
       def get_pep(num):
           'Retrieve text of a Python Enhancement Proposal'

   .. versionadded:: 3.2
"""

TEXTWRAP = """\
.. function:: wrap(text, width=70, *, initial_indent="", \\
                   subsequent_indent="", expand_tabs=True, \\
                   break_on_hyphens=True, tabsize=8, max_lines=None, \\
                   placeholder=' [...]')

   Wraps the single paragraph in *text* (a string) so every line is at most
   *width* characters long.  Returns a list of output lines, without final
   newlines.

.. class:: TextWrapper(**kwargs)

   .. attribute:: break_long_words

      (default: ``True``) If true, then words longer than :attr:`width` will be
      broken in order to ensure that no lines are longer than :attr:`width`.
"""

SHUTIL = """\
.. function:: rmtree(path, ignore_errors=False, onerror=None, *, dir_fd=None)

   .. index:: single: directory; deleting

   Delete an entire directory tree; *path* must point to a directory (but not a
   symbolic link to a directory).  If *ignore_errors* is true, errors resulting
   from failed removals will be ignored.

.. function:: copytree(src, dst, symlinks=False, ignore=None)

   Recursively copy an entire directory tree rooted at *src* to a directory
   named *dst* and return the destination directory.
"""
