"""targetlm: language models whose output side is a first-class, swappable part.

The layers of the package, top to bottom. A module imports only from its own layer or the
layers below it, never from a layer above (``tests/project/test_layering.py`` reads this picture and
checks every import of the package against it, lazy imports inside functions included)::

    cli · __main__                             the commands and python -m targetlm
    training                                   the trainer, its step, checkpointer, optimisers, DDP
    analysis · runs · compare                  reports and measurements; finished runs read back
    builders · extras                          a config wired into components by the registries
    tasks                                      lm, mlm, classification, translation, diffusion
    inference                                  the evaluation loop, combiners, scoring, decoding
    objectives                                 the losses
    modules                                    embeddings, encoders, output layers, heads, model
    lexicon                                    characters, WordNet relations and definitions
    data                                       corpora, tokenizers, vocabularies, batches
    config · checkpoint · rundir · pretrained  plain data, files read back
    functional · chunked · registry · files    equations, chunked logits, registries, writes

Tasks sit above inference: a task owns its evaluation and its decoder and calls
``targetlm.inference`` for them, and nothing in inference imports a task (the code's imports
say so; a picture with inference above tasks would have tasks' evaluations running back up).
The trainer calls the analysis (gradient diversity, the run's report), and an analysis that
trains models (the subspace sweep) is handed its training by the command, so analysis never
imports training. Components (data, lexicon, modules, objectives) never read the
configuration: they take plain keyword arguments from the builders.
"""

__version__ = "0.1.0"
