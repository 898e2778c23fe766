/* A layer's recording method binding in C: what the Python
 * tracetorch.engine.patches._LayerBinding.__get__ and tracetorch.engine.patches.BoundLayerMethod
 * do, without a Python frame on each ``layer.forward`` read or call.
 *
 * ``layer_binding(base)`` makes (once) a subclass of ``base`` (wrapt's FunctionWrapper) whose
 * ``__get__`` slot hands back the wrapped function itself when read from a class, and a
 * ``BoundLayerMethod`` of this file when read from an instance. ``LayerMethod`` derives from it
 * in Python, which keeps the slot (a class that defines no ``__get__`` inherits its base's).
 *
 * ``BoundLayerMethod(method, instance)`` stands for the bound method: calling it calls the
 * method's per-call wrapper as wrapt's own bound wrapper does for a function bound to an
 * instance, ``wrapper(bound, instance, args, kwargs)``, where ``bound`` is the wrapped function
 * bound to the instance (a plain bound method, made once per read). Everything else it answers
 * as that bound method does: ``__wrapped__`` is it, and any attribute this type does not define
 * is read from it (``__self__``, ``__func__``, ``__name__``, ``__doc__``, ``__module__``, its
 * ``__class__``, so ``isinstance(layer.forward, types.MethodType)``); wrapt's ``_self_`` names
 * it does not hold come from the recording method (``_self_tracetorch``), as in wrapt's bound
 * wrapper. wrapt made a proxy per read instead, through keyword parsing: most of what a layer
 * call cost tracetorch.
 *
 * The Python names it reads are listed in tracetorch.engine.native.C_NAMES (see
 * tests/test_c_contract.py); the module is optional: without a compiler, the Python classes run
 * (see tracetorch/engine/native.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *s_wrapped, *s_self_wrapper, *s_doc, *s_module, *s_reduce;
static PyObject *made;        /* the type made by layer_binding, kept for later calls */
static PyObject *made_from;   /* its base */
static PyObject *no_keywords; /* the empty dict handed for a call without keywords */
/* The base's descriptors of ``__wrapped__`` and ``_self_wrapper``, read through directly on
 * a LayerMethod: a Python class over a base that defines ``__getattr__`` looks every attribute
 * up through a Python-level hook (a thousand instructions a read). Data descriptors, they are
 * what such a read finds, as LayerMethod defines neither name; NULL (a plain lookup) if not. */
static PyObject *wrapped_field, *wrapper_field;

typedef struct {
    PyObject_HEAD
    PyObject *method;    /* the recording method (a LayerMethod): wrapt's _self_parent */
    PyObject *instance;  /* the layer it is bound to */
    PyObject *bound;     /* the wrapped function bound to the instance: __wrapped__ */
    PyObject *wrapper;   /* the method's per-call wrapper: its _self_wrapper */
    PyObject *weakrefs;
} Bound;

static PyTypeObject BoundType;

/* ``method.name``, through the base's descriptor ``field`` for a LayerMethod. */
static PyObject *
method_attr(PyObject *method, PyObject *name, PyObject *field)
{
    if (field != NULL && PyObject_TypeCheck(method, (PyTypeObject *)made))
        return Py_TYPE(field)->tp_descr_get(field, method, (PyObject *)Py_TYPE(method));
    return PyObject_GetAttr(method, name);
}

/* The data descriptor ``name`` of ``base``, or NULL (no error) if it has none. */
static PyObject *
data_descriptor(PyObject *base, PyObject *name)
{
    PyObject *found = PyObject_GetAttr(base, name);
    if (found == NULL)
        PyErr_Clear();
    else if (Py_TYPE(found)->tp_descr_get == NULL || Py_TYPE(found)->tp_descr_set == NULL)
        Py_CLEAR(found);
    return found;
}

/* The bound method of ``method`` (a LayerMethod) for ``instance``; NULL with an error set. */
static PyObject *
bind(PyObject *method, PyObject *instance)
{
    PyObject *function = method_attr(method, s_wrapped, wrapped_field);
    if (function == NULL)
        return NULL;
    PyObject *wrapper = method_attr(method, s_self_wrapper, wrapper_field);
    PyObject *bound = wrapper != NULL ? PyMethod_New(function, instance) : NULL;
    Py_DECREF(function);
    if (bound == NULL) {
        Py_XDECREF(wrapper);
        return NULL;
    }
    Bound *self = PyObject_GC_New(Bound, &BoundType);
    if (self == NULL) {
        Py_DECREF(wrapper);
        Py_DECREF(bound);
        return NULL;
    }
    Py_INCREF(method);
    self->method = method;
    Py_INCREF(instance);
    self->instance = instance;
    self->bound = bound;
    self->wrapper = wrapper;
    self->weakrefs = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
Bound_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *method, *instance;
    (void)type;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "BoundLayerMethod(method, instance) takes no keywords");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "BoundLayerMethod", 2, 2, &method, &instance))
        return NULL;
    return bind(method, instance);
}

static int
Bound_traverse(Bound *self, visitproc visit, void *arg)
{
    Py_VISIT(self->method);
    Py_VISIT(self->instance);
    Py_VISIT(self->bound);
    Py_VISIT(self->wrapper);
    return 0;
}

/* No tp_clear, as a bound method has none: its fields stay set for its whole life (nothing
 * here checks for a cleared one), and a cycle through it is broken at another of its objects
 * (the layer's __dict__, a container holding the method). */
static void
Bound_dealloc(Bound *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_DECREF(self->method);
    Py_DECREF(self->instance);
    Py_DECREF(self->bound);
    Py_DECREF(self->wrapper);
    PyObject_GC_Del(self);
}

static PyObject *
Bound_call(Bound *self, PyObject *args, PyObject *kwds)
{
    /* wrapt hands the wrapper a dict of keywords even when there are none: one empty dict for
     * all such calls, as the engine's wrappers never change the dict they are handed (made
     * anew if someone else's code did) */
    PyObject *keywords = kwds;
    if (keywords == NULL && PyDict_GET_SIZE(no_keywords)) {
        PyObject *fresh = PyDict_New();
        if (fresh == NULL)
            return NULL;
        Py_SETREF(no_keywords, fresh);
    }
    keywords = keywords != NULL ? keywords : no_keywords;
    Py_INCREF(keywords);
    PyObject *stack[] = {self->bound, self->instance, args, keywords};
    PyObject *result = PyObject_Vectorcall(self->wrapper, stack, 4, NULL);
    Py_DECREF(keywords);
    return result;
}

/* Whether ``name`` is one of wrapt's ``_self_`` attributes, which a bound wrapper reads from
 * the wrapper it was bound from (``_self_tracetorch``). */
static int
parents(PyObject *name)
{
    Py_ssize_t size;
    const char *text = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &size) : NULL;
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    return size > 6 && strncmp(text, "_self_", 6) == 0;
}

/* An attribute this type defines, else the bound method's (``__doc__`` and ``__module__``,
 * which every type holds for itself, too), else for a ``_self_`` name the recording
 * method's. */
static PyObject *
Bound_getattro(Bound *self, PyObject *name)
{
    if (name == s_doc || name == s_module
        || (PyUnicode_Check(name) && (PyUnicode_Compare(name, s_doc) == 0
                                      || PyUnicode_Compare(name, s_module) == 0)))
        return PyObject_GetAttr(self->bound, name);
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return found;
    PyErr_Clear();
    found = PyObject_GetAttr(self->bound, name);
    if (found != NULL || !parents(name) || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return found;
    PyErr_Clear();
    return PyObject_GetAttr(self->method, name);
}

/* The bound method of an operand, so that ``layer.forward == layer.forward`` as for methods. */
static PyObject *
unwrapped(PyObject *operand)
{
    return PyObject_TypeCheck(operand, &BoundType) ? ((Bound *)operand)->bound : operand;
}

static PyObject *
Bound_richcompare(PyObject *self, PyObject *other, int op)
{
    return PyObject_RichCompare(unwrapped(self), unwrapped(other), op);
}

static Py_hash_t
Bound_hash(Bound *self)
{
    return PyObject_Hash(self->bound);
}

static PyObject *
Bound_repr(Bound *self)
{
    return PyUnicode_FromFormat("<recording %R>", self->bound);
}

static PyObject *
Bound_get_class(Bound *self, void *closure)
{
    (void)closure;
    PyObject *type = (PyObject *)Py_TYPE(self->bound);
    Py_INCREF(type);
    return type;
}

static PyObject *
Bound_reduce(Bound *self, PyObject *unused)
{
    (void)unused;
    /* as the bound method pickles: the layer's attribute, read again when loaded */
    PyObject *reduce = PyObject_GetAttr(self->bound, s_reduce);
    if (reduce == NULL)
        return NULL;
    PyObject *result = PyObject_CallNoArgs(reduce);
    Py_DECREF(reduce);
    return result;
}

static PyObject *
Bound_dir(Bound *self, PyObject *unused)
{
    (void)unused;
    return PyObject_Dir(self->bound);
}

static PyMemberDef Bound_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Bound, bound), READONLY,
     "The wrapped function bound to the layer."},
    {"__self__", T_OBJECT, offsetof(Bound, instance), READONLY, "The layer."},
    {"_self_parent", T_OBJECT, offsetof(Bound, method), READONLY, "The recording method."},
    {"_self_instance", T_OBJECT, offsetof(Bound, instance), READONLY, "The layer."},
    {"_self_wrapper", T_OBJECT, offsetof(Bound, wrapper), READONLY, "The per-call wrapper."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Bound_getset[] = {
    {"__class__", (getter)Bound_get_class, NULL, "The bound method's class.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Bound_methods[] = {
    {"__reduce__", (PyCFunction)Bound_reduce, METH_NOARGS, "Pickled as the bound method."},
    {"__dir__", (PyCFunction)Bound_dir, METH_NOARGS, "The bound method's attributes."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BoundType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracetorch.engine._binding.BoundLayerMethod",
    .tp_doc = "BoundLayerMethod(method, instance): a layer's recording method bound to the layer "
              "(see tracetorch.engine.patches.BoundLayerMethod).",
    .tp_basicsize = sizeof(Bound),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Bound_new,
    .tp_dealloc = (destructor)Bound_dealloc,
    .tp_traverse = (traverseproc)Bound_traverse,
    .tp_call = (ternaryfunc)Bound_call,
    .tp_getattro = (getattrofunc)Bound_getattro,
    .tp_richcompare = Bound_richcompare,
    .tp_hash = (hashfunc)Bound_hash,
    .tp_repr = (reprfunc)Bound_repr,
    .tp_weaklistoffset = offsetof(Bound, weakrefs),
    .tp_members = Bound_members,
    .tp_getset = Bound_getset,
    .tp_methods = Bound_methods,
};

static PyObject *
layer_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    (void)owner;
    if (instance == NULL || instance == Py_None)  /* read from the class */
        return method_attr(self, s_wrapped, wrapped_field);
    return bind(self, instance);
}

static PyType_Slot binding_slots[] = {
    {Py_tp_descr_get, (void *)layer_get},
    {0, NULL},
};

static PyObject *
layer_binding(PyObject *module, PyObject *base)
{
    (void)module;
    if (made != NULL) {
        if (made_from != base) {
            PyErr_SetString(PyExc_ValueError, "layer_binding: made for another base already");
            return NULL;
        }
        Py_INCREF(made);
        return made;
    }
    if (!PyType_Check(base)) {
        PyErr_SetString(PyExc_TypeError, "layer_binding: the base must be a type");
        return NULL;
    }
    PyType_Spec spec = {
        "tracetorch.engine._binding.LayerBinding",
        0, 0,  /* the base's size: no field of its own */
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
        binding_slots,
    };
    made = PyType_FromSpecWithBases(&spec, base);
    if (made == NULL)
        return NULL;
    wrapped_field = data_descriptor(base, s_wrapped);
    wrapper_field = data_descriptor(base, s_self_wrapper);
    Py_INCREF(base);
    made_from = base;
    Py_INCREF(made);
    return made;
}

static PyMethodDef methods[] = {
    {"layer_binding", layer_binding, METH_O,
     "layer_binding(base) -> the subclass of base whose __get__ is the layer method's."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef binding_module = {
    PyModuleDef_HEAD_INIT, "_binding",
    "The binding of a layer's recording method, in C (see tracetorch.engine.patches).",
    -1, methods, NULL, NULL, NULL, NULL,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__binding(void)
{
    INTERN(s_wrapped, "__wrapped__");
    INTERN(s_self_wrapper, "_self_wrapper");
    INTERN(s_doc, "__doc__");
    INTERN(s_module, "__module__");
    INTERN(s_reduce, "__reduce__");
    if ((no_keywords = PyDict_New()) == NULL)
        return NULL;
    if (PyType_Ready(&BoundType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&binding_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&BoundType);
    if (PyModule_AddObject(module, "BoundLayerMethod", (PyObject *)&BoundType) < 0) {
        Py_DECREF(&BoundType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
