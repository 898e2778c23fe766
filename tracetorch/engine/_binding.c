/* A layer's recording method binding in C: what the Python
 * tracetorch.engine.patches._LayerBinding.__get__ does, without a Python frame on each
 * ``layer.forward`` read.
 *
 * ``layer_binding(base)`` makes (once) a subclass of ``base`` (wrapt's FunctionWrapper) whose
 * ``__get__`` slot hands back the wrapped function itself when read from a class and the
 * base's own binding when read from an instance. ``LayerMethod`` derives from it in Python,
 * which keeps the slot (a class that defines no ``__get__`` inherits its base's). Only
 * CPython's stable C API is used; the module is optional: without a compiler, the Python
 * ``__get__`` runs (see tracetorch/engine/native.py). The one Python name it reads,
 * ``__wrapped__``, is listed in tracetorch.engine.native.C_NAMES (see tests/test_c_contract.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_wrapped;
static PyObject *made;        /* the type made by layer_binding, kept for later calls */
static PyObject *made_from;   /* its base */
static descrgetfunc base_get; /* the base's binding */

static PyObject *
layer_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None)  /* read from the class */
        return PyObject_GetAttr(self, s_wrapped);
    return base_get(self, instance, owner);
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
    descrgetfunc get = (descrgetfunc)PyType_GetSlot((PyTypeObject *)base, Py_tp_descr_get);
    if (get == NULL) {
        PyErr_SetString(PyExc_TypeError, "layer_binding: the base must bind (__get__)");
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
    base_get = get;
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

PyMODINIT_FUNC
PyInit__binding(void)
{
    s_wrapped = PyUnicode_InternFromString("__wrapped__");
    if (s_wrapped == NULL)
        return NULL;
    return PyModule_Create(&binding_module);
}
