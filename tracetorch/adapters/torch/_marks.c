/* The torch exit observer's common case in C: marking a layer call's one-tensor output (and
 * the operation-counting switch, below).
 *
 * ``Marker(fallback, namespace)`` stands for tracetorch.adapters.torch.marks.tag_call
 * (``fallback``) and reads that module's globals (``namespace``). For an output that is
 * exactly a ``torch.Tensor``, with the call's symbolic gradient parts already in its
 * per-shape counter, it does what tag_call and _mark do: read ``grad_fn``, resolve the parts
 * (the plain case here, others through the Python ``_layer_parts``), chain the mark
 * ``(frame, parts, inner)`` in ``grad_fn.metadata`` and, for a node marked the first time,
 * add the hook through marks._HOOK_CARRIER's hook dict. Anything else is
 * the Python observer's. As there, an error while marking never reaches the user's model.
 *
 * Every Python name it reads is interned in PyInit__marks, and the positions of the records it
 * shares with Python (a Frame's fields, the counter's slot of the parts, a pass's ``hot``
 * tuple) are found by name when a stand-in is made: tracetorch.engine.native.C_NAMES lists
 * them, and tests/test_c_contract.py checks this file against that list. Optional like the
 * engine's accelerator (see tracetorch/engine/native.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Positions in the records this file shares with Python, found by name when a stand-in is made
 * (never written here as numbers): a Frame's fields (tracetorch.engine.hotpath.Frame;
 * ``frame_size``: how many); for a Marker, the slots of a per-shape counter where marks keeps a
 * call's symbolic gradient parts (marks._PARTS) and the learner its learned counts
 * (marks.LEARNED), and where those keep the places of the call's products
 * (marks.LEARNED_PRODUCTS); for a Boundary, the fields of a pass's ``hot``
 * tuple (backward._Hot; ``hot_size``: how many). */
typedef struct {
    Py_ssize_t collector, node, owner, frame_size;
    Py_ssize_t parts, learned, products;
    Py_ssize_t clock, hot_collector, recompute_of, boundaries, leaves, flops, pass_node, hot_size;
} Layout;

/* The globals a stand-in reads, each by its slot in ``Standin.constants``: names their modules
 * bind once, at import (torch's classes and functions, the marks key, the hook's carrier, the
 * dict of passes, which is changed in place), so each is looked up at its first use and kept
 * rather than in the module's dict at every call. */
enum {
    K_TENSOR, K_PARAMETER, K_MARKS, K_HOOK_CARRIER, K_LAYER_PARTS, K_WATCHED,
    K_CURRENT_NODE, K_PASSES, K_WILL_EXECUTE,
    K_STACK_LEN, K_STACK_AT, K_POP, K_PUSH, K_DROP_RETIRED,
    K_COUNT
};

/* Each type stands for a Python function (Marker: marks.tag_call; Boundary:
 * backward._on_marked_node; Switch: the closure of ops.make_switch): the function itself, for
 * the cases they hand back (a Switch's mode instead), and its module's globals. */
typedef struct {
    PyObject_HEAD
    PyObject *fallback;  /* tag_call (Marker), _on_marked_node (Boundary), the mode (Switch) */
    PyObject *ns;        /* that function's module's globals */
    PyObject *constants[K_COUNT];  /* the globals read so far, by slot (see above) */
    Layout at;           /* where that module's records keep each field */
} Standin;

static PyObject *s_Tensor, *s_PARTS, *s_MARKS, *s_HOOK_CARRIER, *s_layer_parts, *s_WATCHED,
    *s_LEARNED, *s_LEARNED_PRODUCTS,
    *s_grad_fn, *s_metadata, *s_register_hook_dict, *s_base,
    *s_current_node, *s_PASSES, *s_hot, *s_charge, *s_reach, *s_Parameter, *s_parameters,
    *s_requires_grad, *s_will_execute, *s_kind, *s_thread,
    *s_Frame, *s_fields, *s_collector, *s_node, *s_owner, *s_Hot, *s_clock, *s_recompute_of,
    *s_boundaries, *s_leaves, *s_flops, *s_pass_node,
    *s_stack_len, *s_stack_at, *s_pop, *s_push, *s_drop_retired;

/* A global of a stand-in's module (borrowed; NULL with an error set when missing). */
static PyObject *
global(PyObject *ns, PyObject *name)
{
    PyObject *value = PyDict_GetItemWithError(ns, name);
    if (value == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_NameError, name);
    return value;
}

/* The field names of the NamedTuple class ``name`` of ``ns`` (a new reference); NULL with an
 * error set. */
static PyObject *
record_fields(PyObject *ns, PyObject *name)
{
    PyObject *record = global(ns, name);
    return record != NULL ? PyObject_GetAttr(record, s_fields) : NULL;
}

/* The positions of a Frame's fields, from ``ns``'s ``Frame``; 0, or -1 with an error set. */
static int
frame_layout(Layout *at, PyObject *ns)
{
    PyObject *frame = record_fields(ns, s_Frame);
    if (frame == NULL)
        return -1;
    int ok = (at->collector = PySequence_Index(frame, s_collector)) >= 0
             && (at->node = PySequence_Index(frame, s_node)) >= 0
             && (at->owner = PySequence_Index(frame, s_owner)) >= 0
             && (at->frame_size = PySequence_Size(frame)) >= 0;
    Py_DECREF(frame);
    return ok ? 0 : -1;
}

static int
Standin_traverse(Standin *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    Py_VISIT(self->ns);
    for (int slot = 0; slot < K_COUNT; slot++)
        Py_VISIT(self->constants[slot]);
    return 0;
}

static int
Standin_clear(Standin *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->ns);
    for (int slot = 0; slot < K_COUNT; slot++)
        Py_CLEAR(self->constants[slot]);
    return 0;
}

static void
Standin_dealloc(Standin *self)
{
    PyObject_GC_UnTrack(self);
    Standin_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The type table of a stand-in: only its name, doc, init and call differ. */
#define STANDIN_TYPE(var, name, doc, init, call)        \
    static PyTypeObject var = {                         \
        PyVarObject_HEAD_INIT(NULL, 0)                  \
        .tp_name = "tracetorch.adapters.torch._marks." name, \
        .tp_doc = doc,                                  \
        .tp_basicsize = sizeof(Standin),                \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, \
        .tp_new = PyType_GenericNew,                    \
        .tp_init = (initproc)init,                      \
        .tp_dealloc = (destructor)Standin_dealloc,      \
        .tp_traverse = (traverseproc)Standin_traverse,  \
        .tp_clear = (inquiry)Standin_clear,             \
        .tp_call = (ternaryfunc)call,                   \
    }

static int
Standin_init(Standin *self, PyObject *args, PyObject *kwds)
{
    PyObject *fallback, *ns;
    if (!PyArg_ParseTuple(args, "OO!", &fallback, &PyDict_Type, &ns))
        return -1;
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    Py_INCREF(ns);
    Py_XSETREF(self->ns, ns);
    return 0;
}

/* The int global ``name`` of ``ns``, a position (>= 0); -1 with an error set. */
static Py_ssize_t
position(PyObject *ns, PyObject *name)
{
    PyObject *value = global(ns, name);
    if (value == NULL)
        return -1;
    Py_ssize_t at = PyLong_AsSsize_t(value);
    if (at < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "Marker: %S must be a position", name);
    return at;
}

/* Marker(fallback, namespace): the marks module's globals, where its records are found. */
static int
Marker_init(Standin *self, PyObject *args, PyObject *kwds)
{
    if (Standin_init(self, args, kwds) < 0 || frame_layout(&self->at, self->ns) < 0)
        return -1;
    if ((self->at.parts = position(self->ns, s_PARTS)) < 0
            || (self->at.learned = position(self->ns, s_LEARNED)) < 0
            || (self->at.products = position(self->ns, s_LEARNED_PRODUCTS)) < 0)
        return -1;
    return 0;
}

/* Boundary(fallback, namespace): the backward module's globals, where its records are found. */
static int
Boundary_init(Standin *self, PyObject *args, PyObject *kwds)
{
    Layout *at = &self->at;
    if (Standin_init(self, args, kwds) < 0 || frame_layout(at, self->ns) < 0)
        return -1;
    PyObject *hot = record_fields(self->ns, s_Hot);
    if (hot == NULL)
        return -1;
    int ok = (at->clock = PySequence_Index(hot, s_clock)) >= 0
             && (at->hot_collector = PySequence_Index(hot, s_collector)) >= 0
             && (at->recompute_of = PySequence_Index(hot, s_recompute_of)) >= 0
             && (at->boundaries = PySequence_Index(hot, s_boundaries)) >= 0
             && (at->leaves = PySequence_Index(hot, s_leaves)) >= 0
             && (at->flops = PySequence_Index(hot, s_flops)) >= 0
             && (at->pass_node = PySequence_Index(hot, s_pass_node)) >= 0
             && (at->hot_size = PySequence_Size(hot)) >= 0;
    Py_DECREF(hot);
    return ok ? 0 : -1;
}

/* The global ``name`` of the stand-in's module, kept in its ``slot`` from the first read on
 * (borrowed: the stand-in holds it; NULL with an error set when missing). */
static PyObject *
constant(Standin *self, int slot, PyObject *name)
{
    PyObject *value = self->constants[slot];
    if (value == NULL) {
        if ((value = global(self->ns, name)) == NULL)
            return NULL;
        Py_INCREF(value);
        self->constants[slot] = value;
    }
    return value;
}

/* The call's parts resolved as marks._layer_parts resolves them, for the plain case: no
 * keyword arguments, each need an argument index or a parameter of the layer's own, each value
 * a tensor, a parameter or nothing. A new list; NULL with no error set for any other case
 * (the Python function's), NULL with an error set on failure. */
static PyObject *
plain_parts(Standin *self, PyObject *frame, PyObject *args, PyObject *kwargs, PyObject *symbolic)
{
    if (PyDict_GET_SIZE(kwargs) || (!PyList_Check(symbolic) && !PyTuple_Check(symbolic)))
        return NULL;
    PyObject *tensor = constant(self, K_TENSOR, s_Tensor);
    PyObject *parameter = constant(self, K_PARAMETER, s_Parameter);
    if (tensor == NULL || parameter == NULL)
        return NULL;
    PyObject *own = PyObject_GetAttr(PyTuple_GET_ITEM(frame, self->at.owner), s_parameters);
    if (own == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *resolved = PyList_New(0), *needing = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(symbolic);
    PyObject **items = PySequence_Fast_ITEMS(symbolic);
    if (resolved == NULL || !PyDict_Check(own))
        goto other;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = items[i];
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 2
                || !PyTuple_Check(PyTuple_GET_ITEM(part, 1)))
            goto other;
        PyObject *needs = PyTuple_GET_ITEM(part, 1);
        if ((needing = PyList_New(0)) == NULL)
            goto failed;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(needs); j++) {
            PyObject *need = PyTuple_GET_ITEM(needs, j), *value;
            if (PyLong_CheckExact(need)) {
                Py_ssize_t at = PyLong_AsSsize_t(need);
                if (at < 0)
                    goto other;
                value = at < PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, at) : Py_None;
            }
            else if (PyUnicode_CheckExact(need)) {
                value = PyDict_GetItemWithError(own, need);
                if (value == NULL) {
                    if (PyErr_Occurred())
                        goto failed;
                    goto other;  /* not a parameter of its own: an attribute, a submodule's */
                }
            }
            else {
                goto other;
            }
            if (value == Py_None)
                continue;
            PyObject *kind = (PyObject *)Py_TYPE(value);
            if (kind != tensor && kind != parameter)
                goto other;  /* a tuple of tensors, a packed sequence... */
            PyObject *grad = PyObject_GetAttr(value, s_requires_grad);
            if (grad == NULL)
                goto failed;
            int needs_grad = PyObject_IsTrue(grad);
            Py_DECREF(grad);
            if (needs_grad < 0 || (needs_grad && PyList_Append(needing, value) < 0))
                goto failed;
        }
        if (PyList_GET_SIZE(needing)) {
            PyObject *tensors = PyList_AsTuple(needing);
            PyObject *one = tensors != NULL ? PyTuple_Pack(2, PyTuple_GET_ITEM(part, 0), tensors)
                                            : NULL;
            Py_XDECREF(tensors);
            if (one == NULL || PyList_Append(resolved, one) < 0) {
                Py_XDECREF(one);
                goto failed;
            }
            Py_DECREF(one);
        }
        Py_CLEAR(needing);
    }
    Py_DECREF(own);
    return resolved;
other:
    Py_XDECREF(needing);
    Py_XDECREF(resolved);
    Py_DECREF(own);
    return NULL;
failed:
    Py_XDECREF(needing);
    Py_XDECREF(resolved);
    Py_DECREF(own);
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    return NULL;
}

/* Whether ``value`` (an argument of the call) is ``base``, has the node ``below`` or is a view
 * of ``base``: 1 or 0; -1 with an error set. */
static int
given(PyObject *value, PyObject *base, PyObject *below, PyObject *tensor)
{
    if (value == base)
        return 1;
    if (!PyObject_TypeCheck(value, (PyTypeObject *)tensor))
        return 0;
    PyObject *fn = PyObject_GetAttr(value, s_grad_fn);
    if (fn == NULL)
        return -1;
    int same = fn == below;
    Py_DECREF(fn);
    if (same)
        return 1;
    PyObject *own = PyObject_GetAttr(value, s_base);
    if (own == NULL)
        return -1;
    same = own == base;
    Py_DECREF(own);
    return same;
}

/* The node of ``output`` (``fn``, a new reference, replaced) that stays in the graph if the
 * output is written in place later, as marks._lasting_node: for a view, its base's node, where
 * the call made the base. 0, or -1 with an error set. */
static int
lasting_node(PyObject *output, PyObject **fn, PyObject *args, PyObject *kwargs, PyObject *tensor)
{
    PyObject *base = PyObject_GetAttr(output, s_base), *below = NULL;
    int status = -1;
    if (base == NULL)
        return -1;
    if (base == Py_None) {
        status = 0;
        goto done;
    }
    if ((below = PyObject_GetAttr(base, s_grad_fn)) == NULL)
        goto done;
    if (below == Py_None || below == *fn) {
        status = 0;
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
        int found = given(PyTuple_GET_ITEM(args, i), base, below, tensor);
        if (found != 0) {
            status = found < 0 ? -1 : 0;
            goto done;
        }
    }
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(kwargs, &at, &key, &value)) {
        int found = given(value, base, below, tensor);
        if (found != 0) {
            status = found < 0 ? -1 : 0;
            goto done;
        }
    }
    Py_SETREF(*fn, below);
    below = NULL;
    status = 0;
done:
    Py_DECREF(base);
    Py_XDECREF(below);
    return status;
}

/* Mark ``output``'s node; 0, or -1 with an error set. */
static int
mark(Standin *self, PyObject *frame, PyObject *args, PyObject *kwargs, PyObject *output,
     PyObject *symbolic)
{
    int status = -1;
    PyObject *fn = NULL, *parts = NULL, *meta = NULL, *marked = NULL;
    PyObject *marks_key = constant(self, K_MARKS, s_MARKS);
    PyObject *carrier = constant(self, K_HOOK_CARRIER, s_HOOK_CARRIER);
    if (marks_key == NULL || carrier == NULL)
        return -1;
    if ((fn = PyObject_GetAttr(output, s_grad_fn)) == NULL)
        goto done;
    if (fn == Py_None) {
        status = 0;
        goto done;
    }
    PyObject *tensor = constant(self, K_TENSOR, s_Tensor);
    if (tensor == NULL || lasting_node(output, &fn, args, kwargs, tensor) < 0)
        goto done;
    int has_parts = PyObject_IsTrue(symbolic);
    if (has_parts < 0)
        goto done;
    if (has_parts) {
        parts = plain_parts(self, frame, args, kwargs, symbolic);
        if (parts == NULL) {
            if (PyErr_Occurred())
                goto done;
            PyObject *resolve = constant(self, K_LAYER_PARTS, s_layer_parts);
            if (resolve == NULL)
                goto done;
            parts = PyObject_CallFunctionObjArgs(resolve, frame, args, kwargs, symbolic, NULL);
        }
    }
    else {
        parts = PyTuple_New(0);
    }
    if (parts == NULL || (meta = PyObject_GetAttr(fn, s_metadata)) == NULL)
        goto done;
    if (!PyDict_Check(meta)) {
        PyErr_SetString(PyExc_TypeError, "grad_fn.metadata must be a dict");
        goto done;
    }
    PyObject *inner = PyDict_GetItemWithError(meta, marks_key);  /* borrowed */
    if (inner == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(inner);
    marked = PyTuple_Pack(3, frame, parts, inner != NULL ? inner : Py_None);
    if (marked == NULL || PyDict_SetItem(meta, marks_key, marked) < 0) {
        Py_XDECREF(inner);
        goto done;
    }
    if (inner != NULL) {  /* the node's hook is there already */
        Py_DECREF(inner);
        status = 0;
        goto done;
    }
    PyObject *r = PyObject_CallMethodOneArg(fn, s_register_hook_dict, carrier);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    status = 0;
done:
    Py_XDECREF(fn);
    Py_XDECREF(parts);
    Py_XDECREF(meta);
    Py_XDECREF(marked);
    return status;
}

/* Whether the call's products are the Python observer's (see marks._products): its node is
 * watched for learning (in marks.WATCHED), or its counter's learned counts place products.
 * 1 or 0; -1 with an error set. */
static int
has_products(Standin *self, PyObject *frame, PyObject *entry)
{
    PyObject *watched = constant(self, K_WATCHED, s_WATCHED);
    if (watched == NULL)
        return -1;
    if (!PyDict_Check(watched)) {
        PyErr_SetString(PyExc_TypeError, "marks.WATCHED must be a dict");
        return -1;
    }
    if (PyDict_GET_SIZE(watched)) {
        int found = PyDict_Contains(watched, PyTuple_GET_ITEM(frame, self->at.node));
        if (found != 0)
            return found;
    }
    if (PyList_GET_SIZE(entry) <= self->at.learned)
        return 0;
    PyObject *learned = PyList_GET_ITEM(entry, self->at.learned);
    if (!PyTuple_CheckExact(learned) || PyTuple_GET_SIZE(learned) <= self->at.products)
        return 0;
    return PyObject_IsTrue(PyTuple_GET_ITEM(learned, self->at.products));
}

static PyObject *
Marker_call(Standin *self, PyObject *call_args, PyObject *call_kwargs)
{
    /* the engine calls observer(frame, args, kwargs, output, entry), positionally */
    if (PyTuple_GET_SIZE(call_args) != 5 || (call_kwargs != NULL && PyDict_GET_SIZE(call_kwargs))) {
        PyErr_SetString(PyExc_TypeError, "tag_call() takes 5 positional arguments");
        return NULL;
    }
    PyObject *frame = PyTuple_GET_ITEM(call_args, 0), *args = PyTuple_GET_ITEM(call_args, 1),
             *kwargs = PyTuple_GET_ITEM(call_args, 2), *output = PyTuple_GET_ITEM(call_args, 3),
             *entry = PyTuple_GET_ITEM(call_args, 4);
    PyObject *tensor = constant(self, K_TENSOR, s_Tensor);
    if (tensor == NULL)
        return NULL;
    if ((PyObject *)Py_TYPE(output) != tensor || !PyList_Check(entry)
            || PyList_GET_SIZE(entry) <= self->at.parts || !PyTuple_Check(args)
            || !PyDict_Check(kwargs) || !PyTuple_Check(frame)
            || PyTuple_GET_SIZE(frame) < self->at.frame_size)
        return PyObject_Call(self->fallback, call_args, call_kwargs);
    int products = has_products(self, frame, entry);
    if (products < 0)
        return NULL;
    if (products)
        return PyObject_Call(self->fallback, call_args, call_kwargs);
    if (mark(self, frame, args, kwargs, output, PyList_GET_ITEM(entry, self->at.parts)) < 0) {
        /* marking must never break the user's model (as tag_call's ``except Exception``) */
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

STANDIN_TYPE(MarkerType, "Marker",
             "The torch exit observer's common case (see marks.tag_call).", Marker_init,
             Marker_call);


/* ------------------------------------------------------------------------------ boundaries
 * ``Boundary(fallback, namespace)`` stands for backward._on_marked_node, the hook autograd
 * runs at each marked node: with the pass of this thread recorded on the host clock, it does
 * BackwardPass.reach — the calls' parts charged (as ``_charge`` does: in C for a pass into
 * every leaf) and the boundary noted. A pass with a device timer is handed to
 * BackwardPass.reach itself; a node run on another thread and a pass that no entry point
 * announced (no pass of this thread in ``_PASSES``) are the Python hook's. It reads the pass
 * through its ``hot`` tuple (backward._Hot: see BackwardPass), by the positions Boundary_init
 * found.
 */

/* BackwardPass._charge(frame, node, parts) for a pass that accumulates into every leaf
 * (``leaves`` None) and parts as marks resolve them; any other case is the Python method's.
 * Each part's FLOPs count if one of its tensors is a leaf or a node the pass will run. 0, or -1
 * with an error set. */
static int
charge(Standin *self, PyObject *state, PyObject *hot, PyObject *frame, PyObject *node,
       PyObject *parts)
{
    const Layout *at = &self->at;
    int status = -1;
    PyObject *flops = NULL, *kind = NULL;
    PyObject *will = constant(self, K_WILL_EXECUTE, s_will_execute);
    if (will == NULL)
        return -1;
    if (PyTuple_GET_ITEM(hot, at->leaves) != Py_None
            || !(PyList_CheckExact(parts) || PyTuple_CheckExact(parts))
            || PyTuple_GET_SIZE(frame) < at->frame_size)
        goto python;
    if ((flops = PyLong_FromLong(0)) == NULL)
        goto done;
    /* the parts are the mark's (a list only marking builds): nothing changes them here */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(parts); i++) {
        PyObject *part = PySequence_Fast_ITEMS(parts)[i];
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 2
                || !PyTuple_Check(PyTuple_GET_ITEM(part, 1)))
            goto python;
        PyObject *tensors = PyTuple_GET_ITEM(part, 1);
        int counts = 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(tensors) && !counts; j++) {
            PyObject *fn = PyObject_GetAttr(PyTuple_GET_ITEM(tensors, j), s_grad_fn);
            if (fn == NULL)
                goto done;
            if (fn == Py_None) {  /* a leaf: the pass accumulates into every one */
                Py_DECREF(fn);
                counts = 1;
                break;
            }
            PyObject *r = PyObject_CallOneArg(will, fn);
            Py_DECREF(fn);
            if (r == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
                    goto done;
                PyErr_Clear();  /* not a node of this pass's graph */
                continue;
            }
            counts = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (counts < 0)
                goto done;
        }
        if (counts) {
            PyObject *sum = PyNumber_Add(flops, PyTuple_GET_ITEM(part, 0));
            if (sum == NULL)
                goto done;
            Py_SETREF(flops, sum);
        }
    }
    int any = PyObject_IsTrue(flops);
    if (any <= 0) {
        status = any;
        goto done;
    }
    /* products outside every layer (at the profile's root) are the pass's own */
    PyObject *target = node;
    if ((kind = PyObject_GetAttr(node, s_kind)) == NULL)
        goto done;
    int thread = PyObject_RichCompareBool(kind, s_thread, Py_EQ);
    if (thread < 0)
        goto done;
    if (PyTuple_GET_ITEM(frame, at->owner) == Py_None || thread)
        target = PyTuple_GET_ITEM(hot, at->pass_node);
    PyObject *charged = PyTuple_GET_ITEM(hot, at->flops);
    PyObject *before = PyDict_GetItemWithError(charged, target);  /* borrowed */
    if (before == NULL && PyErr_Occurred())
        goto done;
    if (before != NULL) {
        PyObject *sum = PyNumber_Add(before, flops);
        if (sum == NULL)
            goto done;
        Py_SETREF(flops, sum);
    }
    status = PyDict_SetItem(charged, target, flops);
    goto done;
python:
    {
        PyObject *r = PyObject_CallMethodObjArgs(state, s_charge, frame, node, parts, NULL);
        status = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(flops);
    Py_XDECREF(kind);
    return status;
}

/* BackwardPass.reach(mark) on the host clock; 0, or -1 with an error set. */
static int
reach(Standin *self, PyObject *state, PyObject *hot, PyObject *mark)
{
    const Layout *at = &self->at;
    PyObject *collector = PyTuple_GET_ITEM(hot, at->hot_collector);
    PyObject *recompute = PyTuple_GET_ITEM(hot, at->recompute_of);
    PyObject *boundaries = PyTuple_GET_ITEM(hot, at->boundaries);
    PyObject *innermost = Py_NewRef(Py_None);  /* a frame's node, or the one it reruns */
    PyObject *now = PyObject_CallNoArgs(PyTuple_GET_ITEM(hot, at->clock));
    if (now == NULL) {
        Py_DECREF(innermost);
        return -1;
    }
    /* the outermost call heads the chain, the innermost ends it */
    while (mark != Py_None) {
        if (!PyTuple_Check(mark) || PyTuple_GET_SIZE(mark) != 3) {
            PyErr_SetString(PyExc_TypeError, "a mark must be (frame, parts, inner)");
            goto failed;
        }
        PyObject *frame = PyTuple_GET_ITEM(mark, 0);
        PyObject *parts = PyTuple_GET_ITEM(mark, 1);
        if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) < at->frame_size) {
            PyErr_SetString(PyExc_TypeError, "a mark's frame must be a Frame");
            goto failed;
        }
        if (PyTuple_GET_ITEM(frame, at->collector) == collector) {
            PyObject *layer = PyTuple_GET_ITEM(frame, at->node);
            /* a layer run again by activation checkpointing: its gradients are the layer's */
            if (PyDict_GET_SIZE(recompute)) {
                PyObject *original = PyDict_GetItemWithError(recompute, layer);
                if (original == NULL && PyErr_Occurred())
                    goto failed;
                if (original != NULL)
                    layer = original;
            }
            Py_SETREF(innermost, Py_NewRef(layer));
            int has_parts = PyObject_IsTrue(parts);
            if (has_parts < 0 || (has_parts && charge(self, state, hot, frame, innermost,
                                                      parts) < 0))
                goto failed;
        }
        mark = PyTuple_GET_ITEM(mark, 2);
    }
    /* the layer and the time, one after the other */
    int status = PyList_Append(boundaries, innermost) < 0 || PyList_Append(boundaries, now) < 0
                 ? -1 : 0;
    Py_DECREF(innermost);
    Py_DECREF(now);
    return status;
failed:
    Py_DECREF(innermost);
    Py_DECREF(now);
    return -1;
}

static PyObject *
Boundary_call(Standin *self, PyObject *args, PyObject *kwds)
{
    PyObject *node = NULL, *meta = NULL, *key = NULL, *hot = NULL;
    PyObject *current = constant(self, K_CURRENT_NODE, s_current_node);
    PyObject *passes = constant(self, K_PASSES, s_PASSES);
    PyObject *marks_key = constant(self, K_MARKS, s_MARKS);
    if (current == NULL || passes == NULL || marks_key == NULL)
        goto failed;
    if (!PyDict_Check(passes)) {
        PyErr_SetString(PyExc_TypeError, "_PASSES must be a dict");
        goto failed;
    }
    if ((node = PyObject_CallNoArgs(current)) == NULL)
        goto failed;
    if (node == Py_None)
        goto finished;
    if ((meta = PyObject_GetAttr(node, s_metadata)) == NULL)
        goto failed;
    if (!PyDict_Check(meta)) {
        PyErr_SetString(PyExc_TypeError, "grad_fn.metadata must be a dict");
        goto failed;
    }
    PyObject *mark = PyDict_GetItemWithError(meta, marks_key);  /* borrowed, held by meta */
    if (mark == NULL) {
        if (PyErr_Occurred())
            goto failed;
        goto finished;
    }
    if ((key = PyLong_FromUnsignedLong(PyThread_get_thread_ident())) == NULL)
        goto failed;
    PyObject *state = PyDict_GetItemWithError(passes, key);  /* borrowed */
    if (state == NULL) {
        if (PyErr_Occurred())
            goto failed;
        Py_XDECREF(node);
        Py_XDECREF(meta);
        Py_XDECREF(key);
        return PyObject_Call(self->fallback, args, kwds);
    }
    Py_INCREF(state);
    if ((hot = PyObject_GetAttr(state, s_hot)) == NULL) {
        Py_DECREF(state);
        goto failed;
    }
    int done;
    if (hot == Py_None) {  /* a device timer's pass */
        PyObject *r = PyObject_CallMethodOneArg(state, s_reach, mark);
        done = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    else if (!PyTuple_Check(hot) || PyTuple_GET_SIZE(hot) != self->at.hot_size
             || !PyDict_Check(PyTuple_GET_ITEM(hot, self->at.recompute_of))
             || !PyList_Check(PyTuple_GET_ITEM(hot, self->at.boundaries))
             || !PyDict_Check(PyTuple_GET_ITEM(hot, self->at.flops))) {
        PyErr_SetString(PyExc_TypeError, "BackwardPass.hot is not laid out as _marks.c reads it");
        done = -1;
    }
    else {
        done = reach(self, state, hot, mark);
    }
    Py_DECREF(state);
    if (done < 0)
        goto failed;
    goto finished;
failed:
    /* attribution is best effort; the user's gradients are not (as _on_marked_node) */
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        Py_XDECREF(node);
        Py_XDECREF(meta);
        Py_XDECREF(key);
        Py_XDECREF(hot);
        return NULL;
    }
    PyErr_Clear();
finished:
    Py_XDECREF(node);
    Py_XDECREF(meta);
    Py_XDECREF(key);
    Py_XDECREF(hot);
    Py_RETURN_NONE;
}

STANDIN_TYPE(BoundaryType, "Boundary",
             "The hook autograd runs at a marked node (see backward._on_marked_node).",
             Boundary_init, Boundary_call);

/* ------------------------------------------------------------------------------ the switch
 * ``Switch(mode, namespace)`` stands for the closure ops.make_switch makes for ``mode`` (kept as
 * a stand-in's ``fallback``: it has no Python case to hand back), reading the ops module's
 * globals (``namespace``): ``switch(on)`` pushes the mode on the calling thread's
 * function-mode stack unless it is the top already, ``switch(False)`` pops it
 * only if it is the top; each returns whether it changed anything. The engine calls it around
 * every layer call where counting changes (twice per ruled layer), so no Python frame. */
/* A Switch's mode. */
#define MODE(switch) ((switch)->fallback)

/* The ops module's function in ``slot`` called with ``arg`` (or none): a new reference, NULL on
 * error. */
static PyObject *
call_global(Standin *self, int slot, PyObject *name, PyObject *arg)
{
    PyObject *function = constant(self, slot, name);
    if (function == NULL)
        return NULL;
    return arg != NULL ? PyObject_CallOneArg(function, arg) : PyObject_CallNoArgs(function);
}

static PyObject *
Switch_call(Standin *self, PyObject *args, PyObject *kwds)
{
    PyObject *wanted;
    if (!PyArg_ParseTuple(args, "O:switch", &wanted))
        return NULL;
    int on = PyObject_IsTrue(wanted);
    if (on < 0)
        return NULL;
    PyObject *length = call_global(self, K_STACK_LEN, s_stack_len, NULL);
    if (length == NULL)
        return NULL;
    Py_ssize_t depth = PyLong_AsSsize_t(length);
    Py_DECREF(length);
    if (depth < 0)
        return NULL;  /* (an error, or a length that is no count) */
    if (!on) {
        if (!depth)
            Py_RETURN_FALSE;
        /* popped first and put back if it is another's: one call fewer in the usual case */
        PyObject *top = call_global(self, K_POP, s_pop, NULL);
        if (top == NULL)
            return NULL;
        if (top == MODE(self)) {
            Py_DECREF(top);
            Py_RETURN_TRUE;
        }
        PyObject *back = call_global(self, K_PUSH, s_push, top);
        Py_DECREF(top);
        if (back == NULL)
            return NULL;
        Py_DECREF(back);
        Py_RETURN_FALSE;
    }
    if (depth) {
        PyObject *at = PyLong_FromSsize_t(depth - 1);
        PyObject *top = at != NULL ? call_global(self, K_STACK_AT, s_stack_at, at) : NULL;
        Py_XDECREF(at);
        if (top == NULL)
            return NULL;
        int ours = top == MODE(self);
        Py_DECREF(top);
        if (ours)
            Py_RETURN_FALSE;
        /* a retired mode was left by a profile exited in another thread: dropped now (asked
         * only below something: the usual push is onto an empty stack) */
        PyObject *dropped = call_global(self, K_DROP_RETIRED, s_drop_retired, NULL);
        if (dropped == NULL)
            return NULL;
        Py_DECREF(dropped);
    }
    PyObject *pushed = call_global(self, K_PUSH, s_push, MODE(self));
    if (pushed == NULL)
        return NULL;
    Py_DECREF(pushed);
    Py_RETURN_TRUE;
}

STANDIN_TYPE(SwitchType, "Switch",
             "The operation-counting switch of one mode (see ops.make_switch).",
             Standin_init, Switch_call);

static struct PyModuleDef marks_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracetorch.adapters.torch._marks",
    .m_doc = "Marking a torch layer call's output in C (an optional accelerator).",
    .m_size = -1,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__marks(void)
{
    INTERN(s_Tensor, "_Tensor");
    INTERN(s_PARTS, "_PARTS");
    INTERN(s_MARKS, "MARKS");
    INTERN(s_HOOK_CARRIER, "_HOOK_CARRIER");
    INTERN(s_layer_parts, "_layer_parts");
    INTERN(s_WATCHED, "WATCHED");
    INTERN(s_LEARNED, "LEARNED");
    INTERN(s_LEARNED_PRODUCTS, "LEARNED_PRODUCTS");
    INTERN(s_grad_fn, "grad_fn");
    INTERN(s_base, "_base");
    INTERN(s_metadata, "metadata");
    INTERN(s_register_hook_dict, "_register_hook_dict");
    INTERN(s_current_node, "_current_node");
    INTERN(s_PASSES, "_PASSES");
    INTERN(s_hot, "hot");
    INTERN(s_charge, "_charge");
    INTERN(s_reach, "reach");
    INTERN(s_Parameter, "_Parameter");
    INTERN(s_parameters, "_parameters");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_will_execute, "_will_execute");
    INTERN(s_kind, "kind");
    INTERN(s_thread, "thread");
    INTERN(s_Frame, "Frame");
    INTERN(s_fields, "_fields");
    INTERN(s_collector, "collector");
    INTERN(s_node, "node");
    INTERN(s_owner, "owner");
    INTERN(s_Hot, "_Hot");
    INTERN(s_clock, "clock");
    INTERN(s_recompute_of, "recompute_of");
    INTERN(s_boundaries, "boundaries");
    INTERN(s_leaves, "leaves");
    INTERN(s_flops, "flops");
    INTERN(s_pass_node, "pass_node");
    INTERN(s_stack_len, "_stack_len");
    INTERN(s_stack_at, "_stack_at");
    INTERN(s_pop, "_pop");
    INTERN(s_push, "_push");
    INTERN(s_drop_retired, "drop_retired");
    if (PyType_Ready(&MarkerType) < 0 || PyType_Ready(&BoundaryType) < 0
            || PyType_Ready(&SwitchType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&marks_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&MarkerType);
    if (PyModule_AddObject(module, "Marker", (PyObject *)&MarkerType) < 0) {
        Py_DECREF(&MarkerType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&BoundaryType);
    if (PyModule_AddObject(module, "Boundary", (PyObject *)&BoundaryType) < 0) {
        Py_DECREF(&BoundaryType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&SwitchType);
    if (PyModule_AddObject(module, "Switch", (PyObject *)&SwitchType) < 0) {
        Py_DECREF(&SwitchType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
