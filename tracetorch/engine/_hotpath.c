/* The hot path's per-call wrapper in C: what tracetorch.engine.hotpath.make_wrapper's Python
 * ``wrapper`` does on every recorded call of a node that exists, without the interpreter.
 *
 * It is an accelerator, not a second engine: ``Wrapper(fallback, namespace, guard, owner,
 * backward, data)`` is handed the Python wrapper (``fallback``) and the hotpath module's
 * globals (``namespace``), and it reads every setting on each call (the op switch and the op
 * replay, the exit observer and its gate, the grad-mode reader: from the list
 * hotpath._SETTINGS, which each of hotpath's setters updates; the all-threads collector from
 * the globals), so installing or removing one in Python takes effect here too. Whatever is not the common case goes to Python before anything is done (no frame
 * but an all-threads profile, a profile not taking calls, timing other than plain or with call
 * hooks: ``Collector.plain_clock`` is None, a node's first call) or after the call, through
 * the same helpers the
 * Python wrapper uses (``call_key``, the collector's methods).
 *
 * Every Python name it reads is interned in PyInit__hotpath, and the positions of the records
 * it shares with Python (a Frame's fields, a per-shape counter's slots) are found by name when
 * a Wrapper is made: tracetorch.engine.native.C_NAMES lists them, and tests/test_c_contract.py
 * checks this file against that list. Only CPython's stable C API is used; the module is
 * optional: without a compiler, the Python wrapper runs (see tracetorch/engine/native.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>

/* Positions in the two records this file shares with Python, found by name when a Wrapper is
 * made (set_layout), never written here as numbers: a Frame's fields (hotpath.Frame, a
 * NamedTuple: the profile, the node, the call's owner, whether operations are counted and the
 * output observed, and the node's pending durations, per-shape counters, the counter of its
 * last call of several arguments and its children's frames by owner; ``size``: how many), a
 * per-shape counter's slots (tracetorch.records.tree.ENTRY_FIELDS: the calls, the key it was
 * measured for, what is learned of it, the calls replayed from that) and the settings read on
 * every call (hotpath._SETTING_NAMES; ``settings``: how many). Shorts: a Wrapper's fields that
 * every call reads fit in few cache lines, which the products between two calls evict. */
typedef struct {
    PyObject *frame_type;  /* hotpath.Frame itself: an open call is an instance of it */
    short grad_mode, structure, op_switch, op_replay, op_hold, op_observing, exit_observer,
        observe_now, settings;
    short collector, node, owner, ops, observe, pending, flops_cache, last_counter,
        child_frames, size;
    short calls, key, learned, replayed, budget;
} Layout;

typedef struct {
    PyObject *cls;    /* the class the plan was made for (strong); NULL: none yet */
    PyObject *descr;  /* the data descriptor to call (strong), or NULL */
    int from_dict;    /* read the instance's __dict__ (else: descr, or the generic read) */
} ReadPlan;

/* (The fields every call reads first, together; those of its uncommon cases last.) */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;  /* Wrapper_call */
    PyObject *guard;      /* None, a callable or (flags, calls): see guarded() */
    PyObject *owner;      /* the shared owner of every call, or None */
    /* What the hotpath module holds for good, read once: the frame ContextVar (_FRAME), the
     * list of the settings that its setters replace (_SETTINGS), the containers of tensors'
     * classes (_QUIET_READS, _SHAPELESS, _INT_SHAPED; filled in place) */
    PyObject *frame_var, *settings, *quiet_known, *shapeless, *int_shaped;
    PyObject *perf_counter_ns;  /* time.perf_counter_ns (_PERF_COUNTER_NS): see Stopwatch */
    PyObject *no_counters;      /* NO_COUNTERS, one dict for good: read once */
    Py_ssize_t flush_every;     /* FLUSH_EVERY, a constant: read once */
    Layout at;            /* where its namespace's records keep each field */
    ReadPlan training_plan;     /* how its owners' ``training`` is read (see planned_read) */
    int backward;         /* kind == "backward": flush the pass's samples after each call */
    int data;             /* kind == "data": StopIteration is the loop's end, not a failure */
    PyObject *fallback;   /* the Python wrapper: the whole call, for the uncommon cases */
    PyObject *ns;         /* the hotpath module's globals */
    PyObject *child;      /* (kind, label, flops_fn): what Collector.new_child makes a node of at
                           * a first call here; None: the Python wrapper makes it */
} Wrapper;

static PyObject *s_getattribute, *s_FRAME, *s_op_replay, *s_op_hold, *s_op_observing, *s_op_switch, *s_exit_observer, *s_observe_now,
    *s_all_threads,
    *s_call_key, *s_grad_mode, *s_structure, *s_training, *s_QUIET_READS, *s_quiet_reads,
    *s_SHAPELESS, *s_INT_SHAPED,
    *s_dtype, *s_first_entry, *s_FLUSH_EVERY, *s_NO_COUNTERS,
    *s_plain_clock, *s_record_failure, *s_time, *s_flush, *s_touch,
    *s_shape, *s_flush_backward, *s_backward_on, *s_new_child,
    *s_Frame, *s_ENTRY_FIELDS, *s_SETTINGS, *s_SETTING_NAMES, *s_PERF_COUNTER_NS, *s_fields, *s_collector, *s_node, *s_owner, *s_ops, *s_observe,
    *s_pending, *s_flops_cache, *s_last_counter, *s_child_frames, *s_calls, *s_key, *s_learned, *s_replayed, *s_budget;
static PyObject *one;

/* The innermost open call of a context while recorded calls nest in C. Setting the frame
 * ContextVar on each call and resetting it after copies the context's mapping twice and makes
 * a token (on the tiny BERT ~1,700 instructions and ~110 first-level cache misses a call,
 * counted under Valgrind); instead the first C call under a frame set from Python sets the
 * variable to a cell, and the calls nested in it swap the cell's frame and put it back. A
 * cell is swapped only by the thread that made it: in one thread calls nest (asyncio switches
 * tasks between calls, never inside a layer's forward), so what a call puts back is what it
 * found. A context copied while a cell was in it (``contextvars.copy_context``,
 * ``asyncio.to_thread`` inside a layer's forward) and run in another thread cannot know which
 * of the cell's frames was current when it was copied: there it reads the cell's first
 * frame (the call that made the cell, which encloses every frame the cell held), and makes a
 * cell of its own at its first call. Python reads the variable through a FrameReader. */
typedef struct {
    PyObject_HEAD
    PyObject *frame;       /* the innermost open call: a hotpath.Frame */
    PyObject *first;       /* the frame it was made with */
    unsigned long thread;  /* PyThread_get_thread_ident() of the thread that made it */
} FrameCell;

static int
FrameCell_traverse(FrameCell *self, visitproc visit, void *arg)
{
    Py_VISIT(self->frame);
    Py_VISIT(self->first);
    return 0;
}

static int
FrameCell_clear(FrameCell *self)
{
    Py_CLEAR(self->frame);
    Py_CLEAR(self->first);
    return 0;
}

static void
FrameCell_dealloc(FrameCell *self)
{
    PyObject_GC_UnTrack(self);
    FrameCell_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FrameCellType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracetorch.engine._hotpath.FrameCell",
    .tp_doc = "The innermost open call of a context while calls nest in C "
              "(see tracetorch.engine.hotpath).",
    .tp_basicsize = sizeof(FrameCell),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)FrameCell_dealloc,
    .tp_traverse = (traverseproc)FrameCell_traverse,
    .tp_clear = (inquiry)FrameCell_clear,
};

/* A new cell of this thread holding ``frame``. */
static PyObject *
cell_new(PyObject *frame)
{
    FrameCell *cell = PyObject_GC_New(FrameCell, &FrameCellType);
    if (cell == NULL)
        return NULL;
    cell->frame = Py_NewRef(frame);
    cell->first = Py_NewRef(frame);
    cell->thread = PyThread_get_thread_ident();
    PyObject_GC_Track(cell);
    return (PyObject *)cell;
}

/* What the frame variable holds, read through a cell (a new reference: None where it holds
 * nothing; NULL with an error): the cell's current frame where this thread made it, else its
 * first (see FrameCell). ``*ours``, where asked for, gets the cell this thread made (a new
 * reference), the one a call swaps its frame in; else NULL. */
static PyObject *
held_frame(PyObject *frame_var, PyObject **ours)
{
    PyObject *held;
    if (ours != NULL)
        *ours = NULL;
    if (PyContextVar_Get(frame_var, Py_None, &held) < 0)
        return NULL;
    if (!Py_IS_TYPE(held, &FrameCellType))
        return held;
    FrameCell *cell = (FrameCell *)held;
    int mine = cell->thread == PyThread_get_thread_ident();
    PyObject *frame = Py_NewRef(mine ? cell->frame : cell->first);
    if (mine && ours != NULL)
        *ours = held;
    else
        Py_DECREF(held);
    return frame;
}

/* ``FrameReader(var)()``: the innermost open call that ``var`` (hotpath._FRAME) holds, read
 * through a cell; None where it holds nothing. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *var;
} FrameReader;

static PyObject *
FrameReader_call(FrameReader *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "the innermost frame's reader takes no arguments");
        return NULL;
    }
    return held_frame(self->var, NULL);
}

static int
FrameReader_init(FrameReader *self, PyObject *args, PyObject *kwds)
{
    PyObject *var;
    if (!PyArg_ParseTuple(args, "O:FrameReader", &var))
        return -1;
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "FrameReader: var must be a ContextVar");
        return -1;
    }
    self->vectorcall = (vectorcallfunc)FrameReader_call;
    Py_INCREF(var);
    Py_XSETREF(self->var, var);
    return 0;
}

static int
FrameReader_traverse(FrameReader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->var);
    return 0;
}

static int
FrameReader_clear(FrameReader *self)
{
    Py_CLEAR(self->var);
    return 0;
}

static void
FrameReader_dealloc(FrameReader *self)
{
    PyObject_GC_UnTrack(self);
    FrameReader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FrameReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracetorch.engine._hotpath.FrameReader",
    .tp_doc = "FrameReader(var)(): the innermost open call that var holds (see "
              "tracetorch.engine.hotpath.innermost_frame).",
    .tp_basicsize = sizeof(FrameReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FrameReader, vectorcall),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FrameReader_init,
    .tp_dealloc = (destructor)FrameReader_dealloc,
    .tp_traverse = (traverseproc)FrameReader_traverse,
    .tp_clear = (inquiry)FrameReader_clear,
    .tp_call = PyVectorcall_Call,
};

/* A call's frame in place of its caller's, until frame_leave: swapped in the caller's cell
 * (one this thread made: ``*caller`` gets what it held), else in a new cell the variable is
 * set to (``*token``). 0, or -1 with an error set. */
static int
frame_enter(PyObject *frame_var, PyObject *cell, PyObject *inner, PyObject **caller,
            PyObject **token)
{
    if (cell != NULL) {
        *caller = ((FrameCell *)cell)->frame;
        Py_INCREF(inner);
        ((FrameCell *)cell)->frame = inner;
        return 0;
    }
    PyObject *made = cell_new(inner);
    if (made == NULL)
        return -1;
    *token = PyContextVar_Set(frame_var, made);
    Py_DECREF(made);
    return *token == NULL ? -1 : 0;
}

/* Undo frame_enter (once: it clears what it used). 0, or -1 with an error set. */
static int
frame_leave(PyObject *frame_var, PyObject *cell, PyObject **caller, PyObject **token)
{
    if (*caller != NULL) {
        Py_SETREF(((FrameCell *)cell)->frame, *caller);
        *caller = NULL;
        return 0;
    }
    if (*token == NULL)
        return 0;
    int reset = PyContextVar_Reset(frame_var, *token);
    Py_CLEAR(*token);
    return reset;
}

static int guard_form_ok(PyObject *guard);
static PyObject *Wrapper_call(Wrapper *self, PyObject *const *call_args, size_t nargsf,
                              PyObject *kwnames);

/* ``name`` in the hotpath module's globals ``ns`` (borrowed; NULL with an error set, a
 * NameError when missing). */
static PyObject *
ns_item(PyObject *ns, PyObject *name)
{
    PyObject *value = PyDict_GetItemWithError(ns, name);
    if (value == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_NameError, name);
    return value;
}

/* Find a Layout's positions in the records of the hotpath module's globals ``ns`` (its
 * ``Frame``, ``_ENTRY_FIELDS`` and ``_SETTING_NAMES``); 0, or -1 with an error set. */
static int
set_layout(Layout *at, PyObject *ns)
{
    PyObject *frame_type = ns_item(ns, s_Frame);
    PyObject *entry = frame_type != NULL ? ns_item(ns, s_ENTRY_FIELDS) : NULL;
    PyObject *settings = entry != NULL ? ns_item(ns, s_SETTING_NAMES) : NULL;
    if (settings == NULL)
        return -1;
    if (!PyType_Check(frame_type)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: the namespace's Frame must be a class");
        return -1;
    }
    PyObject *frame = PyObject_GetAttr(frame_type, s_fields);
    if (frame == NULL)
        return -1;
    int ok = (at->collector = PySequence_Index(frame, s_collector)) >= 0
             && (at->node = PySequence_Index(frame, s_node)) >= 0
             && (at->owner = PySequence_Index(frame, s_owner)) >= 0
             && (at->ops = PySequence_Index(frame, s_ops)) >= 0
             && (at->observe = PySequence_Index(frame, s_observe)) >= 0
             && (at->pending = PySequence_Index(frame, s_pending)) >= 0
             && (at->flops_cache = PySequence_Index(frame, s_flops_cache)) >= 0
             && (at->last_counter = PySequence_Index(frame, s_last_counter)) >= 0
             && (at->child_frames = PySequence_Index(frame, s_child_frames)) >= 0
             && (at->size = PySequence_Size(frame)) >= 0
             && (at->calls = PySequence_Index(entry, s_calls)) >= 0
             && (at->key = PySequence_Index(entry, s_key)) >= 0
             && (at->learned = PySequence_Index(entry, s_learned)) >= 0
             && (at->replayed = PySequence_Index(entry, s_replayed)) >= 0
             && (at->budget = PySequence_Index(entry, s_budget)) >= 0
             && (at->grad_mode = PySequence_Index(settings, s_grad_mode)) >= 0
             && (at->structure = PySequence_Index(settings, s_structure)) >= 0
             && (at->op_switch = PySequence_Index(settings, s_op_switch)) >= 0
             && (at->op_replay = PySequence_Index(settings, s_op_replay)) >= 0
             && (at->op_hold = PySequence_Index(settings, s_op_hold)) >= 0
             && (at->op_observing = PySequence_Index(settings, s_op_observing)) >= 0
             && (at->exit_observer = PySequence_Index(settings, s_exit_observer)) >= 0
             && (at->observe_now = PySequence_Index(settings, s_observe_now)) >= 0
             && (at->settings = PySequence_Size(settings)) >= 0;
    Py_DECREF(frame);
    if (!ok)
        return -1;
    Py_INCREF(frame_type);
    Py_XSETREF(at->frame_type, frame_type);
    return 0;
}

static int
Wrapper_traverse(Wrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    Py_VISIT(self->ns);
    Py_VISIT(self->guard);
    Py_VISIT(self->owner);
    Py_VISIT(self->child);
    Py_VISIT(self->no_counters);
    Py_VISIT(self->frame_var);
    Py_VISIT(self->quiet_known);
    Py_VISIT(self->shapeless);
    Py_VISIT(self->int_shaped);
    Py_VISIT(self->settings);
    Py_VISIT(self->perf_counter_ns);
    Py_VISIT(self->training_plan.cls);
    Py_VISIT(self->training_plan.descr);
    Py_VISIT(self->at.frame_type);
    return 0;
}

static int
Wrapper_clear(Wrapper *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->ns);
    Py_CLEAR(self->guard);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->child);
    Py_CLEAR(self->no_counters);
    Py_CLEAR(self->frame_var);
    Py_CLEAR(self->quiet_known);
    Py_CLEAR(self->shapeless);
    Py_CLEAR(self->int_shaped);
    Py_CLEAR(self->settings);
    Py_CLEAR(self->perf_counter_ns);
    Py_CLEAR(self->training_plan.cls);
    Py_CLEAR(self->training_plan.descr);
    Py_CLEAR(self->at.frame_type);
    return 0;
}

static void
Wrapper_dealloc(Wrapper *self)
{
    PyObject_GC_UnTrack(self);
    Wrapper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Wrapper_init(Wrapper *self, PyObject *args, PyObject *kwds)
{
    PyObject *fallback, *ns, *guard, *owner, *child = Py_None;
    int backward, data;
    if (!PyArg_ParseTuple(args, "OO!OOpp|O:Wrapper", &fallback, &PyDict_Type, &ns, &guard, &owner,
                          &backward, &data, &child))
        return -1;
    self->vectorcall = (vectorcallfunc)Wrapper_call;
    if (child != Py_None && (!PyTuple_Check(child) || PyTuple_GET_SIZE(child) != 3)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: child must be (kind, label, flops_fn) or None");
        return -1;
    }
    Py_INCREF(child);
    Py_XSETREF(self->child, child);
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    Py_INCREF(ns);
    Py_XSETREF(self->ns, ns);
    if (PyTuple_Check(guard) && !guard_form_ok(guard))
        return -1;
    Py_INCREF(guard);
    Py_XSETREF(self->guard, guard);
    Py_INCREF(owner);
    Py_XSETREF(self->owner, owner);
    self->backward = backward;
    self->data = data;
    if (set_layout(&self->at, ns) < 0)
        return -1;
    PyObject *flush = ns_item(ns, s_FLUSH_EVERY);
    if (flush == NULL)
        return -1;
    self->flush_every = PyLong_AsSsize_t(flush);
    if (self->flush_every == -1 && PyErr_Occurred())
        return -1;
    PyObject *names[] = {s_NO_COUNTERS, s_FRAME, s_QUIET_READS, s_SHAPELESS, s_INT_SHAPED,
                         s_SETTINGS, s_PERF_COUNTER_NS};
    PyObject **into[] = {&self->no_counters, &self->frame_var, &self->quiet_known,
                         &self->shapeless, &self->int_shaped, &self->settings,
                         &self->perf_counter_ns};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        PyObject *held = ns_item(ns, names[i]);
        if (held == NULL)
            return -1;
        Py_INCREF(held);
        Py_XSETREF(*into[i], held);
    }
    if (!PyContextVar_CheckExact(self->frame_var) || !PyDict_Check(self->quiet_known)
            || !PyAnySet_Check(self->shapeless) || !PyAnySet_Check(self->int_shaped)
            || !PyList_Check(self->settings)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: _FRAME must be a ContextVar, _QUIET_READS a "
                        "dict, _SHAPELESS and _INT_SHAPED sets of classes, _SETTINGS a list");
        return -1;
    }
    return 0;
}

/* The setting at ``at`` of hotpath._SETTINGS (borrowed; NULL with an error set where the list
 * is shorter than _SETTING_NAMES: it was not published). */
static PyObject *
setting(Wrapper *self, Py_ssize_t at)
{
    if (PyList_GET_SIZE(self->settings) != self->at.settings) {
        PyErr_SetString(PyExc_RuntimeError, "hotpath._SETTINGS does not hold _SETTING_NAMES");
        return NULL;
    }
    return PyList_GET_ITEM(self->settings, at);
}

/* A global of the hotpath module (borrowed; NULL with an error set when missing). */
static PyObject *
global(Wrapper *self, PyObject *name)
{
    return ns_item(self->ns, name);
}

/* ------------------------------------------------------------------------------ guards
 * A wrapper's guard is None, a callable (true: the call goes straight through) or its form in
 * data, ``(flags, calls)``: true while one of ``flags`` (``(object, attribute name)`` pairs) is
 * true or one of ``calls`` returns true, asked without a Python frame (the torch adapter's
 * tracer test, asked on every layer call: ``tracing.native_guard``). */

/* Whether ``guard`` is a well-formed ``(flags, calls)``; 0 with a TypeError set if not. */
static int
guard_form_ok(PyObject *guard)
{
    if (PyTuple_GET_SIZE(guard) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(guard, 0))
            || !PyTuple_Check(PyTuple_GET_ITEM(guard, 1)))
        goto bad;
    PyObject *flags = PyTuple_GET_ITEM(guard, 0), *calls = PyTuple_GET_ITEM(guard, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flags); i++) {
        PyObject *flag = PyTuple_GET_ITEM(flags, i);
        if (!PyTuple_Check(flag) || PyTuple_GET_SIZE(flag) != 2
                || !PyUnicode_Check(PyTuple_GET_ITEM(flag, 1)))
            goto bad;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(calls); i++) {
        if (!PyCallable_Check(PyTuple_GET_ITEM(calls, i)))
            goto bad;
    }
    return 1;
bad:
    PyErr_SetString(PyExc_TypeError, "Wrapper: a guard tuple must be (flags, calls): "
                    "(object, attribute name) pairs and callables");
    return 0;
}

/* Whether a truth value holds: 1, 0, or -1 with an error set; ``value`` is released. */
static int
truth(PyObject *value)
{
    if (value == NULL)
        return -1;
    int yes = PyObject_IsTrue(value);
    Py_DECREF(value);
    return yes;
}

/* Whether one of the callables of the tuple ``calls`` returns something true: 1, 0, or -1 with
 * an error set. */
static int
any_call_true(PyObject *calls)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(calls); i++) {
        int yes = truth(PyObject_CallNoArgs(PyTuple_GET_ITEM(calls, i)));
        if (yes != 0)
            return yes;
    }
    return 0;
}

/* getattr(holder, name) for a guard's flag (a new reference; NULL with an error set). A flag is
 * a module's global (torch's compile and fx flags), read on every call: from a plain module's
 * __dict__ directly, which is where getattr finds it (ModuleType has no attribute of such a
 * name), without the generic lookup along the module's class first; anything else, or a name
 * not in the __dict__ (a module __getattr__, the AttributeError), the generic way. */
static PyObject *
flag_value(PyObject *holder, PyObject *name)
{
    if (PyModule_CheckExact(holder)) {
        PyObject *value = PyDict_GetItemWithError(PyModule_GetDict(holder), name);
        if (value != NULL)
            return Py_NewRef(value);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetAttr(holder, name);
}

/* Whether a wrapper's guard holds: 1, 0, or -1 with an error set. */
static int
guarded(PyObject *guard)
{
    if (!PyTuple_Check(guard))
        return truth(PyObject_CallNoArgs(guard));
    PyObject *flags = PyTuple_GET_ITEM(guard, 0), *calls = PyTuple_GET_ITEM(guard, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flags); i++) {
        PyObject *flag = PyTuple_GET_ITEM(flags, i);
        int yes = truth(flag_value(PyTuple_GET_ITEM(flag, 0), PyTuple_GET_ITEM(flag, 1)));
        if (yes != 0)
            return yes;
    }
    return any_call_true(calls);
}

/* ------------------------------------------------------------------------------ the wrapper */

/* Whether ``frame`` is a Frame (made only by Frame.of and tuple.__new__ with all its fields;
 * the containers in it are checked by the calls that use them); 0 with a TypeError set if not. */
static int
is_frame(const Layout *at, PyObject *frame)
{
    if ((PyObject *)Py_TYPE(frame) == at->frame_type && PyTuple_GET_SIZE(frame) >= at->size)
        return 1;
    PyErr_SetString(PyExc_TypeError, "an open call must be a tracetorch Frame");
    return 0;
}

/* The wrapped call itself, with empty keyword arguments passed as none. */
static PyObject *
call_wrapped(PyObject *wrapped, PyObject *args, PyObject *kwargs)
{
    return PyObject_Call(wrapped, args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
}

/* switch(on) -> whether it changed anything; -1 on error. */
static int
op_switch(PyObject *sw, int on)
{
    PyObject *result = PyObject_CallOneArg(sw, on ? Py_True : Py_False);
    if (result == NULL)
        return -1;
    int changed = PyObject_IsTrue(result);
    Py_DECREF(result);
    return changed;
}

/* A call's start and end on its profile's clock (Collector.plain_clock). Where that is
 * time.perf_counter_ns on Linux, both are read here from the clock it reads (CLOCK_MONOTONIC,
 * in ns) with no Python call and no int object but the duration's; otherwise the clock is
 * called and its readings are subtracted as Python does. */
typedef struct {
    PyObject *clock;
    int native;
    long long start_ns, end_ns;
    PyObject *start, *end;  /* the readings as objects: the clock's, or made when asked */
} Stopwatch;

/* The monotonic clock in ns, as time.perf_counter_ns reads it on Linux; -1 with an error set. */
static int
monotonic_ns(long long *ns)
{
#ifdef __linux__
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    *ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    return 0;
#else
    PyErr_SetString(PyExc_SystemError, "no native clock here");  /* (never asked: see below) */
    return -1;
#endif
}

/* Read the clock into ``*ns`` (native) or ``*reading``; 0, or -1 with an error set. */
static int
read_clock(Stopwatch *watch, long long *ns, PyObject **reading)
{
    if (watch->native)
        return monotonic_ns(ns);
    return (*reading = PyObject_CallNoArgs(watch->clock)) == NULL ? -1 : 0;
}

static int
stopwatch_start(Wrapper *self, Stopwatch *watch, PyObject *clock)
{
#ifdef __linux__
    watch->native = clock == self->perf_counter_ns;
#else
    watch->native = 0;
#endif
    watch->clock = clock;
    return read_clock(watch, &watch->start_ns, &watch->start);
}

static int
stopwatch_stop(Stopwatch *watch)
{
    return read_clock(watch, &watch->end_ns, &watch->end);
}

/* end - start (a new reference), as the Python wrapper's ``end - start``. */
static PyObject *
stopwatch_elapsed(Stopwatch *watch)
{
    if (watch->native)
        return PyLong_FromLongLong(watch->end_ns - watch->start_ns);
    return PyNumber_Subtract(watch->end, watch->start);
}

/* The readings as objects (for Collector.record_failure); 0, or -1 with an error set. */
static int
stopwatch_readings(Stopwatch *watch)
{
    if (!watch->native)
        return 0;
    return (watch->start = PyLong_FromLongLong(watch->start_ns)) == NULL
           || (watch->end = PyLong_FromLongLong(watch->end_ns)) == NULL ? -1 : 0;
}

/* A call's duration appended to its node's pending time batch (TimeStats.add, inlined as the
 * Python wrapper does). */
static int
add_plain_time(PyObject *node, PyObject *pending, PyObject *elapsed, Py_ssize_t flush_every)
{
    if (PyList_Append(pending, elapsed) < 0)  /* (an error if ``pending`` is no list) */
        return -1;
    if (PyList_GET_SIZE(pending) < flush_every)
        return 0;
    PyObject *time = PyObject_GetAttr(node, s_time);
    if (time == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodNoArgs(time, s_flush);
    Py_DECREF(time);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* ------------------------------------------------------------------------- attribute reads
 * Read the generic way, an attribute's name is first looked up along its class's bases, in
 * dicts that the products run between two calls evict, and a torch module's attribute twice
 * (its class has a __getattr__, so its __getattribute__ is looked up too). What that lookup
 * finds depends on the class only, so a ReadPlan keeps it for the last class it was asked
 * about: where the class reads attributes as object.__getattribute__ does, a data descriptor
 * of the name (a tensor's ``shape``) is called directly, and where the class has nothing of
 * the name, the instance's __dict__ is read (a module's ``training``; not there: the generic
 * read, then the class's __getattr__, as getattr does). Any other class reads generically.
 * (A class changed after its first call is read as it was then.) ReadPlan: see the top. */

static PyObject *object_getattribute;  /* object.__getattribute__, found once */

/* Make ``plan`` the plan of reading ``name`` from instances of ``cls``; 0, or -1 with an error
 * set. */
static int
make_plan(ReadPlan *plan, PyObject *cls, PyObject *name)
{
    PyObject *descr = NULL;
    int from_dict = 0;
    if (((PyTypeObject *)cls)->tp_getattro == PyObject_GenericGetAttr
            || _PyType_Lookup((PyTypeObject *)cls, s_getattribute) == object_getattribute) {
        PyObject *found = _PyType_Lookup((PyTypeObject *)cls, name);  /* borrowed */
        if (found == NULL)
            from_dict = 1;
        else if (Py_TYPE(found)->tp_descr_get != NULL && Py_TYPE(found)->tp_descr_set != NULL)
            descr = Py_NewRef(found);
    }
    Py_INCREF(cls);
    Py_XSETREF(plan->cls, cls);
    Py_XSETREF(plan->descr, descr);
    plan->from_dict = from_dict;
    return 0;
}

/* getattr(value, name) as ``plan`` reads it (made for ``value``'s class first, if need be):
 * 1 with ``*found`` a new reference, 0 where ``value`` has no such attribute, -1 with an error
 * set (as _PyObject_LookupAttr). */
static int
planned_read(ReadPlan *plan, PyObject *value, PyObject *name, PyObject **found)
{
    PyObject *cls = (PyObject *)Py_TYPE(value);
    if (plan->cls != cls && make_plan(plan, cls, name) < 0)
        return -1;
    if (plan->descr != NULL) {
        *found = Py_TYPE(plan->descr)->tp_descr_get(plan->descr, value, cls);
        if (*found != NULL)
            return 1;
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();  /* (then getattr's way: a __getattr__ is asked) */
    }
    else if (plan->from_dict) {
        PyObject *dict = PyObject_GenericGetDict(value, NULL);
        if (dict == NULL)
            PyErr_Clear();  /* (no __dict__: the generic read below says what there is) */
        else {
            *found = PyDict_GetItemWithError(dict, name);
            Py_XINCREF(*found);
            Py_DECREF(dict);
            if (*found != NULL)
                return 1;
            if (PyErr_Occurred())
                return -1;
        }
    }
    return _PyObject_LookupAttr(value, name, found);
}

/* How the last tensor class is read: its ``shape`` and its ``dtype``. */
static ReadPlan shape_plan, dtype_plan;

/* getattr(value, name, None) as a new reference, read by ``plan``; NULL with an error set on
 * any other error. */
static PyObject *
attr_or_none(ReadPlan *plan, PyObject *value, PyObject *name)
{
    PyObject *found = NULL;
    return planned_read(plan, value, name, &found) < 0 ? NULL : found != NULL ? found
           : Py_NewRef(Py_None);
}

/* Whether ``value``'s attributes are read as they are (1), or only quietly, through
 * hotpath.call_key (0: a torch subclass with its own __torch_function__); -1 on error. The
 * answer per class is tensors.QUIET_READS's, classified by tensors.quiet_reads at first sight. */
static int
reads_directly(Wrapper *self, PyObject *value)
{
    PyObject *cls = (PyObject *)Py_TYPE(value);
    PyObject *quiet = PyDict_GetItemWithError(self->quiet_known, cls);  /* borrowed */
    if (quiet != NULL)
        return quiet == Py_None;
    if (PyErr_Occurred())
        return -1;
    PyObject *classify = global(self, s_quiet_reads);
    if (classify == NULL || (quiet = PyObject_CallOneArg(classify, cls)) == NULL)
        return -1;
    int direct = quiet == Py_None;
    Py_DECREF(quiet);
    return direct;
}

/* Whether ``entry`` was measured for (shape, ``dtype``, (``grad``, ``structure``,
 * ``training``)), its key checked by identity only, as the Python wrapper first checks it (no:
 * compare the keys). */
static int
made_for(Py_ssize_t key_at, PyObject *entry, PyObject *dtype, PyObject *grad,
         PyObject *structure, PyObject *training)
{
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) <= key_at)
        return 0;
    PyObject *made = PyList_GET_ITEM(entry, key_at);
    if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 3)
        return 0;
    PyObject *context = PyTuple_GET_ITEM(made, 2);
    return PyTuple_GET_ITEM(made, 1) == dtype && PyTuple_Check(context)
           && PyTuple_GET_SIZE(context) == 3 && PyTuple_GET_ITEM(context, 0) == grad
           && PyTuple_GET_ITEM(context, 1) == structure
           && PyTuple_GET_ITEM(context, 2) == training;
}

/* The owner's ``training`` flag if it is a bool, else None (hotpath.training_flag): borrowed.
 * (Read as the wrapper's plan says: the owners of one wrapper are mostly of one class.) */
static PyObject *
training_flag(Wrapper *self, PyObject *owner)
{
    PyObject *flag = NULL;
    if (planned_read(&self->training_plan, owner, s_training, &flag) < 0)
        PyErr_Clear();  /* a property that raises: no flag, as getattr(..., None) gives */
    Py_XDECREF(flag);  /* True and False are static objects: safe to return borrowed */
    return (flag == Py_True || flag == Py_False) ? flag : Py_None;
}

/* The key (shape, dtype, (grad, structure, training)) of a one-tensor call, as
 * hotpath.call_key makes it. */
static PyObject *
shaped_key(PyObject *shape, PyObject *dtype, PyObject *grad, PyObject *structure,
           PyObject *training)
{
    PyObject *context = PyTuple_Pack(3, grad, structure, training);
    if (context == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(3, shape, dtype, context);
    Py_DECREF(context);
    return key;
}

/* Where the items of a call's key go as its arguments are walked (walk_key): appended to
 * ``items`` (a key being made), or, where ``items`` is NULL, compared with those of ``key``
 * from ``at`` on (a kept key checked against a call without making the call's). */
typedef struct {
    PyObject *items;
    PyObject *key;
    Py_ssize_t at;
} KeySink;

/* ``item`` appended, or compared with the kept key's next item by equality, as a dict compares
 * two keys (identity first). 1: appended or equal; 0: not equal, or the kept key is shorter;
 * -1 with an error set. ``dims``: a shape, entered as a plain tuple (compared as it is). */
static int
put_item(KeySink *sink, PyObject *item, int dims)
{
    if (sink->items != NULL) {
        /* (torch.Size is a tuple: its items copied, no iteration) */
        PyObject *entered = dims && PyTuple_Check(item) ? PyTuple_GetSlice(item, 0, PY_SSIZE_T_MAX)
                            : dims ? PySequence_Tuple(item) : Py_NewRef(item);
        if (entered == NULL)
            return -1;
        int appended = PyList_Append(sink->items, entered);
        Py_DECREF(entered);
        return appended < 0 ? -1 : 1;
    }
    if (sink->at >= PyTuple_GET_SIZE(sink->key))
        return 0;
    PyObject *kept = PyTuple_GET_ITEM(sink->key, sink->at++);
    return kept == item ? 1 : PyObject_RichCompareBool(kept, item, Py_EQ);
}

/* One argument of a call into its key, as tensors._collect_shapes enters it (for a key): a
 * value of a class in tensors.SHAPELESS as itself (a NaN as None), its shape as a tuple and
 * its dtype for one of a class in tensors.INT_SHAPED read directly. 1: entered (or equal);
 * 0: any other value, or a shape that cannot be read (hotpath.call_key then makes the whole
 * key), or not equal; -1 with an error set. */
static int
enter_argument(Wrapper *self, PyObject *value, KeySink *sink, PyObject *shapeless,
               PyObject *int_shaped)
{
    PyObject *cls = (PyObject *)Py_TYPE(value);
    int found = PySet_Contains(shapeless, cls);
    if (found) {
        if (found < 0)
            return -1;
        /* a NaN (Python's or numpy's), never equal to itself, would make a new key at each
         * call: None, as _collect_shapes's ``value == value`` decides */
        PyObject *entered = value;
        if (value != Py_None && !PyLong_CheckExact(value) && !PyUnicode_CheckExact(value)
                && !PyBool_Check(value)) {
            PyObject *same = PyObject_RichCompare(value, value, Py_EQ);
            int equal = same != NULL ? PyObject_IsTrue(same) : -1;
            Py_XDECREF(same);
            if (equal < 0)
                return -1;
            if (!equal)
                entered = Py_None;
        }
        return put_item(sink, entered, 0);
    }
    if ((found = PySet_Contains(int_shaped, cls)) <= 0)
        return found;
    int direct = reads_directly(self, value);
    if (direct <= 0)
        return direct;
    PyObject *shape = NULL;
    if (planned_read(&shape_plan, value, s_shape, &shape) <= 0) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int entered = put_item(sink, shape, 1);
    Py_DECREF(shape);
    if (entered == 1) {
        PyObject *dtype = attr_or_none(&dtype_plan, value, s_dtype);
        entered = dtype != NULL ? put_item(sink, dtype, 0) : -1;
        Py_XDECREF(dtype);
    }
    return entered;
}

/* A call of plain arguments (tensors of int-shaped classes, and None, flags, numbers,
 * strings) walked as hotpath.call_key makes its key: each argument entered as enter_argument
 * does, positional ones then each keyword's name and value, then (grad, structure, training).
 * 1: all entered (or equal, and the kept key has no more items); 0 where an argument is of
 * any other kind or something differs; -1 on error. */
static int
walk_key(Wrapper *self, PyObject *args, PyObject *kwargs, PyObject *grad, PyObject *structure,
         PyObject *training, KeySink *sink)
{
    PyObject *shapeless = self->shapeless, *int_shaped = self->int_shaped;
    int made = 1;
    for (Py_ssize_t i = 0; made == 1 && i < PyTuple_GET_SIZE(args); i++)
        made = enter_argument(self, PyTuple_GET_ITEM(args, i), sink, shapeless, int_shaped);
    PyObject *name, *value;
    Py_ssize_t at = 0;
    while (made == 1 && PyDict_Next(kwargs, &at, &name, &value)) {
        made = put_item(sink, name, 0);
        if (made == 1)
            made = enter_argument(self, value, sink, shapeless, int_shaped);
    }
    if (made != 1)
        return made;
    PyObject *context = PyTuple_Pack(3, grad, structure, training);
    if (context == NULL)
        return -1;
    made = put_item(sink, context, 0);
    Py_DECREF(context);
    return made == 1 && sink->items == NULL && sink->at != PyTuple_GET_SIZE(sink->key) ? 0 : made;
}

/* The key of a call of plain arguments (walk_key): 1 with ``*key`` set; 0 where an argument
 * is of any other kind (call_key makes the key); -1 on error. */
static int
plain_key(Wrapper *self, PyObject *args, PyObject *kwargs, PyObject *grad, PyObject *structure,
          PyObject *training, PyObject **key)
{
    KeySink sink = {PyList_New(0), NULL, 0};
    if (sink.items == NULL)
        return -1;
    int made = walk_key(self, args, kwargs, grad, structure, training, &sink);
    if (made == 1 && (*key = PyList_AsTuple(sink.items)) == NULL)
        made = -1;
    Py_DECREF(sink.items);
    return made;
}

/* Whether the counter ``entry`` (a list, or None) was made for this call of plain arguments:
 * its key equal to the one plain_key would make, checked without making it. 1, 0, or -1 with
 * an error set. */
static int
kept_for(Wrapper *self, PyObject *entry, PyObject *args, PyObject *kwargs, PyObject *grad,
         PyObject *structure, PyObject *training)
{
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) <= self->at.key
            || !PyTuple_Check(PyList_GET_ITEM(entry, self->at.key)))
        return 0;
    KeySink sink = {NULL, PyList_GET_ITEM(entry, self->at.key), 0};
    Py_INCREF(sink.key);  /* (a comparison runs Python code, which could replace it) */
    int kept = walk_key(self, args, kwargs, grad, structure, training, &sink);
    Py_DECREF(sink.key);
    return kept;
}

/* The counter of this call of the frame ``frame``, by its key (hotpath.call_key), as
 * hotpath._lookup finds it: a one-tensor call's first key is kept under its shape alone, and
 * the rest of it checked by identity, then by equality (``grad``: the grad mode, read
 * already); another key of that shape is built here, (shape, dtype, (grad, structure
 * generation, training)). A call of several plain arguments is first compared with the key of
 * the node's last such call (its ``last_counter``), in place: the usual call of a block is
 * the same as the last. Sets ``*entry`` (NULL: none yet), ``*key`` (NULL where the shape or
 * the last counter found it; made where not found) and ``*shape`` (NULL: not a one-tensor
 * call), each a new reference; 0, or -1 with an error set. */
static int
lookup_entry(Wrapper *self, PyObject *frame, PyObject *owner, PyObject *args, PyObject *kwargs,
             PyObject *grad, PyObject **entry_out, PyObject **key_out, PyObject **shape_out)
{
    PyObject *key = NULL, *entry = NULL, *shape = NULL, *dtype = NULL;
    PyObject *cache = PyTuple_GET_ITEM(frame, self->at.flops_cache);
    PyObject *recent = PyTuple_GET_ITEM(frame, self->at.last_counter);
    int status = -1;
    *entry_out = *key_out = *shape_out = NULL;
    if (cache == self->no_counters) {  /* a frame keeping no counter (a running total's): no key */
        *key_out = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyList_Check(recent) || PyList_GET_SIZE(recent) != 1) {
        PyErr_SetString(PyExc_TypeError, "a frame's last_counter must be a one-item list");
        return -1;
    }
    PyObject *structure = setting(self, self->at.structure);
    if (structure == NULL)
        return -1;
    Py_INCREF(structure);
    PyObject *training = training_flag(self, owner);
    int direct = 0;
    if (PyTuple_GET_SIZE(args) == 1 && PyDict_GET_SIZE(kwargs) == 0
            && (direct = reads_directly(self, PyTuple_GET_ITEM(args, 0))) < 0)
        goto done;
    if (direct) {
        PyObject *value = PyTuple_GET_ITEM(args, 0);
        if ((shape = attr_or_none(&shape_plan, value, s_shape)) == NULL) {
            /* a shape that cannot be read (a strided nested tensor): call_key's */
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                goto done;
            PyErr_Clear();
        }
        else if (shape == Py_None) {
            Py_CLEAR(shape);
        }
    }
    if (shape != NULL) {
        if ((dtype = attr_or_none(&dtype_plan, PyTuple_GET_ITEM(args, 0), s_dtype)) == NULL)
            goto done;
        entry = PyDict_GetItemWithError(cache, shape);  /* borrowed */
        if (entry == NULL && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                goto done;
            /* a ``.shape`` that cannot key a dict (a list...): call_key's can */
            PyErr_Clear();
            Py_CLEAR(shape);
        }
        else if (entry != NULL
                 && !made_for(self->at.key, entry, dtype, grad, structure, training)) {
            /* checked by identity first: a key equal to it made of other objects is its key */
            Py_INCREF(entry);
            int same = 0;
            if ((key = shaped_key(shape, dtype, grad, structure, training)) == NULL)
                same = -1;
            else if (PyList_Check(entry) && PyList_GET_SIZE(entry) > self->at.key)
                same = PyObject_RichCompareBool(PyList_GET_ITEM(entry, self->at.key), key,
                                                Py_EQ);
            Py_DECREF(entry);
            if (same < 0)
                goto done;
            if (!same)
                entry = NULL;
        }
    }
    if (entry == NULL) {
        int plain = 0;
        if (key == NULL && shape != NULL) {
            key = shaped_key(shape, dtype, grad, structure, training);
        }
        else if (key == NULL) {
            PyObject *last = Py_NewRef(PyList_GET_ITEM(recent, 0));
            int kept = last == Py_None ? 0 : kept_for(self, last, args, kwargs, grad, structure,
                                                      training);
            if (kept != 0) {
                if (kept > 0) {
                    *entry_out = last;
                    status = 0;
                }
                else {
                    Py_DECREF(last);
                }
                goto done;
            }
            Py_DECREF(last);
            if ((plain = plain_key(self, args, kwargs, grad, structure, training, &key)) < 0)
                goto done;
            if (plain == 0) {
                PyObject *call_key = global(self, s_call_key);
                if (call_key == NULL)
                    goto done;
                key = PyObject_CallFunctionObjArgs(call_key, args, kwargs, owner, NULL);
            }
        }
        if (key == NULL)
            goto done;
        entry = PyDict_GetItemWithError(cache, key);
        if (entry == NULL && PyErr_Occurred())
            goto done;
        if (plain && entry != NULL) {  /* the node's next call is compared with this one first */
            Py_INCREF(entry);
            if (PyList_SetItem(recent, 0, entry) < 0)  /* (steals the reference) */
                goto done;
        }
    }
    Py_XINCREF(entry);
    *entry_out = entry;
    *key_out = key;
    *shape_out = shape;
    key = shape = NULL;
    status = 0;
done:
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_DECREF(structure);
    return status;
}

/* Whether learned counts may not stand in for a call now: one of hotpath._op_hold's callables
 * returned something true (1), none did (0); -1 with an error set. */
static int
replay_held(Wrapper *self)
{
    PyObject *hold = setting(self, self->at.op_hold);
    if (hold == NULL)
        return -1;
    if (!PyTuple_Check(hold)) {
        PyErr_SetString(PyExc_TypeError, "_op_hold must be a tuple of callables");
        return -1;
    }
    Py_INCREF(hold);  /* (a callable could replace the setting) */
    int held = any_call_true(hold);
    Py_DECREF(hold);
    return held;
}

/* ``entry[at] += 1`` for a per-shape counter (a list); 0, or -1 with an error set. */
static int
bump(PyObject *entry, Py_ssize_t at)
{
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) <= at) {
        PyErr_SetString(PyExc_TypeError, "a per-shape entry must be a list of ENTRY_FIELDS");
        return -1;
    }
    PyObject *after = PyNumber_Add(PyList_GET_ITEM(entry, at), one);
    return after == NULL || PyList_SetItem(entry, at, after) < 0 ? -1 : 0;  /* steals after */
}

/* A learned counter's budget less the calls replayed since the last fold (hotpath.set_op_replay);
 * 0 with an exception set where a slot is not an int. */
static Py_ssize_t
budget_left(const Layout *at, PyObject *entry)
{
    if (PyList_GET_SIZE(entry) <= at->budget || PyList_GET_SIZE(entry) <= at->replayed) {
        PyErr_SetString(PyExc_TypeError, "a per-shape entry must be a list of ENTRY_FIELDS");
        return 0;
    }
    Py_ssize_t budget = PyLong_AsSsize_t(PyList_GET_ITEM(entry, at->budget));
    Py_ssize_t spent = budget == -1 && PyErr_Occurred()
                       ? -1 : PyLong_AsSsize_t(PyList_GET_ITEM(entry, at->replayed));
    return spent == -1 && PyErr_Occurred() ? 0 : budget - spent;
}

/* hotpath.count_call: entry[CALLS] += 1, and the counter's first call since the last fold
 * has the next fold fold the node (Collector.touch). */
static int
count_call(Py_ssize_t calls_at, PyObject *collector, PyObject *node, PyObject *entry)
{
    int first = PyList_Check(entry) && PyList_GET_SIZE(entry) > calls_at
                ? PyObject_Not(PyList_GET_ITEM(entry, calls_at)) : 0;
    if (first < 0 || bump(entry, calls_at) < 0)  /* (bump says what is wrong with entry) */
        return -1;
    if (!first)
        return 0;
    PyObject *r = PyObject_CallMethodOneArg(collector, s_touch, node);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *
Wrapper_call(Wrapper *self, PyObject *const *call_args, size_t nargsf, PyObject *kwnames)
{
    /* wrapt calls wrapper(wrapped, instance, args, kwargs), positionally (a vectorcall: no
     * tuple of the four is made) */
    Py_ssize_t given = PyVectorcall_NARGS(nargsf);
    if (given != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))
            || !PyTuple_Check(call_args[2]) || !PyDict_Check(call_args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "wrapper(wrapped, instance, args, kwargs) takes a tuple and a dict");
        return NULL;
    }
    PyObject *wrapped = call_args[0], *instance = call_args[1];
    PyObject *args = call_args[2], *kwargs = call_args[3];

    if (self->guard != Py_None) {
        int yes = guarded(self->guard);
        if (yes < 0)
            return NULL;
        if (yes)
            return call_wrapped(wrapped, args, kwargs);
    }
    PyObject *frame_var = self->frame_var, *cell;
    PyObject *frame = held_frame(frame_var, &cell);
    if (frame == NULL)
        return NULL;
    if (frame == Py_None) {  /* (and no cell) */
        Py_DECREF(frame);
        PyObject *watcher = global(self, s_all_threads);
        if (watcher == NULL)
            return NULL;
        if (watcher != Py_None)  /* a profile watching every thread: Python finds its frame */
            return PyObject_Vectorcall(self->fallback, call_args, 4, NULL);
        return call_wrapped(wrapped, args, kwargs);
    }
    /* From here ``frame`` (and ``cell``) is a new reference, released at ``out``. */
    PyObject *result = NULL, *node = NULL, *inner = NULL, *token = NULL, *caller = NULL;
    PyObject *clock = NULL, *output = NULL, *elapsed = NULL, *entry = NULL;
    Stopwatch watch = {NULL, 0, 0, 0, NULL, NULL};
    PyObject *sw = NULL, *grad_mode = NULL, *grad = NULL, *key = NULL, *shape = NULL;
    PyObject *replay = NULL;
    int switched = 0, quiet = 0;
    PyObject *looked = NULL;  /* the structure generation the counter was found for, if before */
    if (!is_frame(&self->at, frame))
        goto out;
    PyObject *collector = PyTuple_GET_ITEM(frame, self->at.collector);
    PyObject *parent_owner = PyTuple_GET_ITEM(frame, self->at.owner);
    int ops = PyObject_IsTrue(PyTuple_GET_ITEM(frame, self->at.ops));
    if (ops < 0)
        goto out;
    PyObject *owner = self->owner != Py_None ? self->owner
                      : (instance == Py_None ? wrapped : instance);
    /* None while the profile takes no calls or times them other than plainly (a device clock,
     * a timeline, call hooks): the Python wrapper then does it all */
    if ((clock = PyObject_GetAttr(collector, s_plain_clock)) == NULL)
        goto out;
    if (clock == Py_None) {
        result = PyObject_Vectorcall(self->fallback, call_args, 4, NULL);
        goto out;
    }
    if (parent_owner == owner) {
        /* super().forward() or a layer calling itself is the same call */
        result = call_wrapped(wrapped, args, kwargs);
        goto out;
    }
    {
        PyObject *key = PyLong_FromVoidPtr(owner);
        if (key == NULL)
            goto out;
        /* borrowed */
        inner = PyDict_GetItemWithError(PyTuple_GET_ITEM(frame, self->at.child_frames), key);
        Py_DECREF(key);
        if (inner == NULL && PyErr_Occurred())
            goto out;
        Py_XINCREF(inner);
    }
    if (inner == NULL) {  /* its first call here: the collector names and makes the node */
        if (self->child == Py_None) {
            result = PyObject_Vectorcall(self->fallback, call_args, 4, NULL);
            goto out;
        }
        inner = PyObject_CallMethodObjArgs(collector, s_new_child, frame, owner,
                                           PyTuple_GET_ITEM(self->child, 0),
                                           PyTuple_GET_ITEM(self->child, 1),
                                           PyTuple_GET_ITEM(self->child, 2), NULL);
        if (inner == NULL)
            goto out;
    }
    if (!is_frame(&self->at, inner))
        goto out;
    node = PyTuple_GET_ITEM(inner, self->at.node);
    Py_INCREF(node);
    int inner_ops = PyObject_IsTrue(PyTuple_GET_ITEM(inner, self->at.ops));
    int observe = PyObject_IsTrue(PyTuple_GET_ITEM(inner, self->at.observe));
    if (inner_ops < 0 || observe < 0)
        goto out;
    /* The grad mode, a part of the call's key (see hotpath.call_key) */
    if ((grad_mode = setting(self, self->at.grad_mode)) == NULL)
        goto out;
    Py_INCREF(grad_mode);
    if (grad_mode == Py_None) {
        Py_INCREF(Py_None);
        grad = Py_None;
    }
    else if ((grad = PyObject_CallNoArgs(grad_mode)) == NULL) {
        goto out;
    }
    sw = setting(self, self->at.op_switch);
    if (sw == NULL)
        goto out;
    Py_INCREF(sw);
    if (inner_ops) {  /* its counts learned: a frame with ops off (hotpath.set_op_replay) */
        if ((replay = setting(self, self->at.op_replay)) == NULL)
            goto out;
        Py_INCREF(replay);  /* (held: the calls below run Python code) */
        if (replay != Py_None) {
            int held = replay_held(self);  /* as _op_hold says */
            if (held < 0)
                goto out;
            /* A caller that counts has the profile's own mode on the stack (a model's call at
             * the top of a block): off while the key is read, whose reads must reach no mode,
             * where that leaves nothing to hold the replay (the call runs with it off anyway
             * once replayed; else it is put back first) */
            int lifted = held && ops && sw != Py_None ? op_switch(sw, 0) : 0;
            if (lifted < 0)
                goto out;
            int failed = lifted && (held = replay_held(self)) < 0;
            if (!failed && !held) {  /* (what makes the counter's key is read before the call) */
                failed = (looked = setting(self, self->at.structure)) == NULL;
                Py_XINCREF(looked);
                failed = failed || lookup_entry(self, inner, owner, args, kwargs, grad, &entry,
                                                &key, &shape) < 0;
            }
            if (lifted) {  /* back on the stack, whatever happened: the first error is raised */
                PyObject *type, *value, *traceback;
                PyErr_Fetch(&type, &value, &traceback);
                int back = op_switch(sw, 1);
                if (type != NULL) {
                    if (back < 0)
                        PyErr_Clear();
                    PyErr_Restore(type, value, traceback);
                }
                failed = failed || back < 0;
            }
            if (failed)
                goto out;
            PyObject *learned = entry != NULL && PyList_Check(entry)
                                && PyList_GET_SIZE(entry) > self->at.learned
                                ? PyList_GET_ITEM(entry, self->at.learned) : NULL;
            int replayed_here = 0;
            if (learned != NULL && PyTuple_CheckExact(learned) && PyTuple_GET_SIZE(learned) >= 5
                    && PyTuple_GET_ITEM(learned, 3) == inner
                    && is_frame(&self->at, PyTuple_GET_ITEM(learned, 4))) {
                PyObject *observing = setting(self, self->at.op_observing);
                if (observing == NULL)
                    goto out;
                /* (no call watched, the usual case: the node itself is not read) */
                int watched = PyDict_CheckExact(observing) && !PyDict_GET_SIZE(observing)
                              ? 0 : PySequence_Contains(observing, node);
                if (watched < 0)
                    goto out;
                /* its budget spent, the call goes to the learner, which checks the counts */
                if (!watched && budget_left(&self->at, entry) <= 0) {
                    if (PyErr_Occurred())
                        goto out;
                    watched = 1;
                }
                if (!watched) {
                    /* the counter counts the call; its counts reach the node at the fold
                     * (hotpath.settle_replayed). (``learned`` stays in ``entry``, held here.) */
                    if (bump(entry, self->at.replayed) < 0)
                        goto out;
                    Py_SETREF(inner, Py_NewRef(PyTuple_GET_ITEM(learned, 4)));
                    replayed_here = 1;
                }
            }
            if (!replayed_here) {
                PyObject *replayed = PyObject_CallFunctionObjArgs(
                    replay, inner, args, kwargs, owner, entry != NULL ? entry : Py_None, NULL);
                if (replayed == NULL || !is_frame(&self->at, replayed)) {
                    Py_XDECREF(replayed);
                    goto out;
                }
                Py_SETREF(inner, replayed);
            }
            if ((inner_ops = PyObject_IsTrue(PyTuple_GET_ITEM(inner, self->at.ops))) < 0)
                goto out;
        }
    }
    if (ops != inner_ops && sw != Py_None) {
        if ((switched = op_switch(sw, inner_ops)) < 0)
            goto out;
    }
    if (frame_enter(frame_var, cell, inner, &caller, &token) < 0)
        goto out;
    if (stopwatch_start(self, &watch, clock) < 0)
        goto out;  /* (the frame is put back at ``out``) */

    output = call_wrapped(wrapped, args, kwargs);
    if (output == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        int stopped = stopwatch_stop(&watch) == 0 && stopwatch_readings(&watch) == 0;
        if (!stopped)
            PyErr_Clear();
        if (frame_leave(frame_var, cell, &caller, &token) < 0)
            PyErr_Clear();
        if (switched && op_switch(sw, ops) < 0)
            PyErr_Clear();
        if (stopped && !(self->data && PyErr_GivenExceptionMatches(type, PyExc_StopIteration))) {
            /* (a data loader running out of batches is the loop's end, not a failed call) */
            PyObject *r = PyObject_CallMethodObjArgs(collector, s_record_failure, node,
                                                     watch.start, watch.end,
                                                     NULL);
            if (r == NULL)
                PyErr_Clear();
            Py_XDECREF(r);
        }
        PyErr_Restore(type, value, tb);
        goto out;
    }
    if (stopwatch_stop(&watch) < 0)
        goto out;
    if (frame_leave(frame_var, cell, &caller, &token) < 0)
        goto out;
    /* Counting stays off while a torch module's tensor attributes are read (see hotpath.py). */
    if (observe && inner_ops && sw != Py_None) {
        if ((quiet = op_switch(sw, 0)) < 0)
            goto out;
    }
    if ((elapsed = stopwatch_elapsed(&watch)) == NULL)
        goto out;
    if (add_plain_time(node, PyTuple_GET_ITEM(inner, self->at.pending), elapsed,
                       self->flush_every) < 0)
        goto out;
    /* The call's counter, by its key (hotpath.call_key), unless found before the call with
     * the structure generation still current (the call may have found a layer replaced since
     * the last opening, which changes its key: structure_changed) */
    if (looked != NULL) {
        PyObject *now = setting(self, self->at.structure);
        if (now == NULL)
            goto out;
        if (now != looked) {
            Py_CLEAR(looked);
            Py_CLEAR(entry);
            Py_CLEAR(key);
            Py_CLEAR(shape);
        }
    }
    if (looked == NULL
            && lookup_entry(self, inner, owner, args, kwargs, grad, &entry, &key, &shape) < 0)
        goto out;
    if (entry == NULL) {
        entry = PyObject_CallMethodObjArgs(collector, s_first_entry, node, owner, key,
                                           shape != NULL ? shape : Py_None, args, kwargs,
                                           output, NULL);
        if (entry == NULL)
            goto out;
    }
    if (count_call(self->at.calls, collector, node, entry) < 0)
        goto out;
    if (observe) {
        PyObject *observer = setting(self, self->at.exit_observer);
        if (observer == NULL)
            goto out;
        if (observer != Py_None) {
            PyObject *now = setting(self, self->at.observe_now);
            if (now == NULL)
                goto out;
            /* (torch's gate is its grad mode, read above already) */
            PyObject *asked = grad;
            if (now == grad_mode)
                Py_INCREF(asked);
            else if ((asked = PyObject_CallNoArgs(now)) == NULL)
                goto out;
            int yes = PyObject_IsTrue(asked);
            Py_DECREF(asked);
            if (yes > 0) {
                /* a profile between the steps it samples (backward_every) marks nothing */
                PyObject *on = PyObject_GetAttr(collector, s_backward_on);
                if (on == NULL)
                    goto out;
                yes = PyObject_IsTrue(on);
                Py_DECREF(on);
            }
            if (yes < 0)
                goto out;
            if (yes) {
                Py_INCREF(observer);
                PyObject *r = PyObject_CallFunctionObjArgs(observer, inner, args, kwargs, output,
                                                           entry, NULL);
                Py_DECREF(observer);
                if (r == NULL)
                    goto out;
                Py_DECREF(r);
            }
        }
    }
    if (self->backward) {
        PyObject *r = PyObject_CallMethodOneArg(collector, s_flush_backward, node);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
    }
    if (ops && (quiet || switched) && op_switch(sw, 1) < 0)
        goto out;
    result = output;
    output = NULL;
out:
    if (caller != NULL || token != NULL) {  /* left early: the caller's frame back first */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (frame_leave(frame_var, cell, &caller, &token) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    Py_XDECREF(cell);
    Py_XDECREF(looked);
    Py_XDECREF(replay);
    Py_XDECREF(frame);
    Py_XDECREF(node);
    Py_XDECREF(inner);
    Py_XDECREF(sw);
    Py_XDECREF(clock);
    Py_XDECREF(watch.start);
    Py_XDECREF(watch.end);
    Py_XDECREF(elapsed);
    Py_XDECREF(entry);
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(grad_mode);
    Py_XDECREF(grad);
    Py_XDECREF(output);
    return result;
}

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracetorch.engine._hotpath.Wrapper",
    .tp_doc = "The hot path's per-call wrapper (see tracetorch.engine.hotpath.make_wrapper).",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Wrapper_init,
    .tp_dealloc = (destructor)Wrapper_dealloc,
    .tp_traverse = (traverseproc)Wrapper_traverse,
    .tp_clear = (inquiry)Wrapper_clear,
    .tp_call = PyVectorcall_Call,
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracetorch.engine._hotpath",
    .m_doc = "The hot path's per-call wrapper in C (an optional accelerator).",
    .m_size = -1,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    INTERN(s_FRAME, "_FRAME");
    INTERN(s_op_switch, "_op_switch");
    INTERN(s_op_replay, "_op_replay");
    INTERN(s_op_hold, "_op_hold");
    INTERN(s_op_observing, "_op_observing");
    INTERN(s_exit_observer, "_exit_observer");
    INTERN(s_observe_now, "_observe_now");
    INTERN(s_all_threads, "_all_threads");
    INTERN(s_call_key, "call_key");
    INTERN(s_grad_mode, "_grad_mode");
    INTERN(s_structure, "_structure");
    INTERN(s_training, "training");
    INTERN(s_getattribute, "__getattribute__");
    if ((object_getattribute = _PyType_Lookup(&PyBaseObject_Type, s_getattribute)) == NULL)
        return NULL;
    Py_INCREF(object_getattribute);
    INTERN(s_QUIET_READS, "_QUIET_READS");
    INTERN(s_quiet_reads, "quiet_reads");
    INTERN(s_SHAPELESS, "_SHAPELESS");
    INTERN(s_INT_SHAPED, "_INT_SHAPED");
    INTERN(s_dtype, "dtype");
    INTERN(s_first_entry, "first_entry");
    INTERN(s_NO_COUNTERS, "NO_COUNTERS");
    INTERN(s_FLUSH_EVERY, "FLUSH_EVERY");
    INTERN(s_plain_clock, "plain_clock");
    INTERN(s_record_failure, "record_failure");
    INTERN(s_time, "time");
    INTERN(s_flush, "flush");
    INTERN(s_touch, "touch");
    INTERN(s_shape, "shape");
    INTERN(s_flush_backward, "flush_backward");
    INTERN(s_backward_on, "backward_on");
    INTERN(s_new_child, "new_child");
    INTERN(s_Frame, "Frame");
    INTERN(s_ENTRY_FIELDS, "_ENTRY_FIELDS");
    INTERN(s_SETTINGS, "_SETTINGS");
    INTERN(s_SETTING_NAMES, "_SETTING_NAMES");
    INTERN(s_PERF_COUNTER_NS, "_PERF_COUNTER_NS");
    INTERN(s_fields, "_fields");
    INTERN(s_collector, "collector");
    INTERN(s_node, "node");
    INTERN(s_owner, "owner");
    INTERN(s_ops, "ops");
    INTERN(s_observe, "observe");
    INTERN(s_pending, "pending");
    INTERN(s_flops_cache, "flops_cache");
    INTERN(s_last_counter, "last_counter");
    INTERN(s_child_frames, "child_frames");
    INTERN(s_calls, "calls");
    INTERN(s_key, "key");
    INTERN(s_learned, "learned");
    INTERN(s_replayed, "replayed");
    INTERN(s_budget, "budget");
    if ((one = PyLong_FromLong(1)) == NULL)
        return NULL;
    if (PyType_Ready(&WrapperType) < 0 || PyType_Ready(&FrameCellType) < 0
            || PyType_Ready(&FrameReaderType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Wrapper", (PyObject *)&WrapperType) < 0
            || PyModule_AddObjectRef(module, "FrameReader", (PyObject *)&FrameReaderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
