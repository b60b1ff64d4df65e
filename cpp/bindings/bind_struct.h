// Binds a plain C++ struct to Python field by field, so that the field list and
// the defaults (the struct's own initialisers) are written once; and the other
// shapes several rooms bind alike.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace pyspec_bind {

namespace py = pybind11;

// A flag another thread sets to stop a generation (the Python layer sets it on Ctrl-C).
struct CancelToken {
    std::atomic<bool> flag{false};
};

// Binds a plain struct field by field; the names, in order, become the class's
// FIELDS, which the keyword constructor and to_dict() go by.
template <class T>
class Struct {
public:
    Struct(py::module_& m, const char* name, const char* doc) : cls_(m, name, doc) {}
    template <class F>
    Struct& field(const char* name, F T::*member) {
        cls_.def_readwrite(name, member);
        names_.push_back(name);
        return *this;
    }
    template <class Get, class Set>
    Struct& property(const char* name, Get get, Set set) {
        cls_.def_property(name, get, set);
        names_.push_back(name);
        return *this;
    }
    // T(**kwargs): C++ defaults, then the named fields; `check` validates the result.
    py::class_<T>& done(void (*check)(const T&) = nullptr) {
        cls_.attr("FIELDS") = py::tuple(py::cast(names_));
        const auto names = names_;
        cls_.def(py::init([names, check](const py::kwargs& kw) {
            auto value = std::make_unique<T>();
            py::object view = py::cast(value.get(), py::return_value_policy::reference);
            for (const auto& item : kw) {
                const auto key = item.first.cast<std::string>();
                if (std::find(names.begin(), names.end(), key) == names.end()) {
                    throw py::type_error("unexpected argument '" + key + "'");
                }
                view.attr(key.c_str()) = item.second;
            }
            if (check) check(*value);
            return value;
        }));
        cls_.def("to_dict", [names](py::object self) {
            py::dict d;
            for (const auto& n : names) d[n.c_str()] = self.attr(n.c_str());
            return d;
        });
        cls_.def("__repr__", [names](py::object self) {
            std::string out = py::str(py::type::of(self).attr("__name__"));
            out += "(";
            for (size_t i = 0; i < names.size(); ++i) {
                out += (i ? ", " : "") + names[i] + "=" + std::string(py::repr(self.attr(names[i].c_str())));
            }
            return out + ")";
        });
        return cls_;
    }

private:
    py::class_<T> cls_;
    std::vector<std::string> names_;
};

// m.fn(): a catalog (the drafters, the policies) as a list of dicts
// {name, <field>, summary}, one per entry.
template <class Info, class F>
void def_catalog(py::module_& m, const char* fn, const std::vector<Info>& (*catalog)(), const char* field,
                 F Info::*member, const char* doc) {
    m.def(fn, [catalog, field, member] {
        py::list out;
        for (const Info& i : catalog()) {
            py::dict d;
            d["name"] = i.name;
            d[field] = i.*member;
            d["summary"] = i.summary;
            out.append(d);
        }
        return out;
    }, doc);
}

}  // namespace pyspec_bind
